"""The V2 REST frontend: routes by model name and hands the raw body to the engine.

It never parses tensors: the infer route reads the URL and one header, passes the body
on, and writes the engine's reply bytes out as they are.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import inferpool
from inferpool.engine.client import EngineClient
from inferpool.engine.states import ModelState
from inferpool.engine.worker.handler import KIND_CUSTOM, KIND_REST, Reply, custom_body
from inferpool.errors import InferpoolError, Overloaded
from inferpool.frontends import rest_input
from inferpool.frontends.access_log import RestAccessLog
from inferpool.frontends.rest_input import await_reply, read_body, request_timeout, scan_headers

JSON = "application/json"
EXTENSIONS = ["model_repository", "statistics", "binary_tensor_data"]


def json_response(document: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(document), status_code=status, media_type=JSON)


def error_response(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


def reply_response(reply: Reply) -> Response:
    if reply.status != 200:
        return error_response(reply.status, reply.body.decode("utf-8", "replace"))
    if reply.json_length is None:
        return Response(reply.body, media_type=JSON)
    return Response(
        reply.body,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(reply.json_length)},
    )


def build_app(client: EngineClient) -> Starlette:
    """The Starlette app for one engine client."""

    async def live(request: Request) -> Response:
        if client.live:
            return json_response({"live": True})
        return json_response({"live": False, "error": client.live_reason()}, 503)

    async def ready(request: Request) -> Response:
        reason = client.not_ready_reason()
        if reason is None:
            return json_response({"ready": True})
        return json_response({"ready": False, "error": reason}, 503)

    async def server_metadata(request: Request) -> Response:
        return json_response(
            {"name": "inferpool", "version": inferpool.__version__, "extensions": EXTENSIONS}
        )

    async def model_metadata(request: Request) -> Response:
        params = request.path_params
        status = client.table.find(params["name"], params.get("version"))
        document = dict(status.metadata) or {
            "name": status.name,
            "versions": [status.version] if status.version else [],
            "platform": "",
            "inputs": [],
            "outputs": [],
        }
        document["state"] = status.state.value
        if status.reason:
            document["reason"] = status.reason
        return json_response(document)

    async def model_ready(request: Request) -> Response:
        params = request.path_params
        status = client.table.find(params["name"], params.get("version"))
        if status.state is ModelState.READY:
            return json_response({"name": status.name, "ready": True})
        return json_response({"name": status.name, "ready": False, "error": status.describe()}, 503)

    max_body = client.settings.max_body_bytes
    default_timeout = client.settings.request_timeout

    async def infer(request: Request) -> Response:
        scope = request.scope
        content_length, binary, timeout_header = scan_headers(scope["headers"])
        timeout = request_timeout(timeout_header, default_timeout)
        body = await read_body(request.receive, content_length, max_body)
        json_length = rest_input.json_length(binary, len(body))
        params = scope["path_params"]
        deadline = None if timeout is None else time.monotonic() + timeout
        call = client.infer(
            params["name"], params.get("version"), KIND_REST, body, json_length, deadline
        )
        return reply_response(await await_reply(scope, request.receive, call, timeout))

    async def custom_endpoint(request: Request) -> Response:
        scope = request.scope
        content_length, _, timeout_header = scan_headers(scope["headers"])
        timeout = request_timeout(timeout_header, default_timeout)
        body = await read_body(request.receive, content_length, max_body)
        params = scope["path_params"]
        body = custom_body(params["endpoint"], body)
        deadline = None if timeout is None else time.monotonic() + timeout
        call = client.infer(
            params["name"], params.get("version"), KIND_CUSTOM, body, None, deadline
        )
        return reply_response(await await_reply(scope, request.receive, call, timeout))

    async def repository_index(request: Request) -> Response:
        return json_response([s.index_entry() for s in client.table.all()])

    async def repository_load(request: Request) -> Response:
        require_admin(client, request)
        await client.load_model(request.path_params["name"])
        return json_response({})

    async def repository_unload(request: Request) -> Response:
        require_admin(client, request)
        await client.unload_model(request.path_params["name"])
        return json_response({})

    async def statistics(request: Request) -> Response:
        params = request.path_params
        return json_response(client.statistics(params.get("name"), params.get("version")))

    model = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version}"
    routes = [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server_metadata),
        Route("/v2/models/stats", statistics),
        Route("/v2/repository/index", repository_index, methods=["POST", "GET"]),
        Route("/v2/repository/models/{name}/load", repository_load, methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", repository_unload, methods=["POST"]),
    ]
    for prefix in (model, versioned):
        routes += [
            Route(prefix, model_metadata),
            Route(prefix + "/ready", model_ready),
            Route(prefix + "/infer", infer, methods=["POST"]),
            Route(prefix + "/stats", statistics),
        ]
    # Runtime-registered endpoints last, so they never shadow a protocol route.
    routes += [
        Route(model + "/{endpoint}", custom_endpoint, methods=["POST"]),
        Route(versioned + "/{endpoint}", custom_endpoint, methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(RestAccessLog)] if client.settings.access_log else [],
        exception_handlers={InferpoolError: _inferpool_error, HTTPException: _http_error},
    )


def require_admin(client: EngineClient, request: Request) -> None:
    """An admin route's guard: 401 without the admin token, 403 if the API is disabled."""
    client.admin.require(request.headers.get("authorization"))


async def _inferpool_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, InferpoolError)
    response = error_response(exc.status, exc.message)
    if isinstance(exc, Overloaded):
        response.headers["Retry-After"] = "1"
    return response


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, str(exc.detail))
