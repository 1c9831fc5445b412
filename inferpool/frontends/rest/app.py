"""The V2 REST frontend: formats the data plane's answers as JSON over Starlette.

Every answer but inference comes from ``dataplane.DataPlane``; this module maps it to a
response (the document as JSON, 503 for a false health flag, the error tree's status for
what it raises). It never parses tensors: the infer route reads the URL and a few headers,
passes the body on (inflated if it came compressed; with the request's headers in front
for a user's runtime, which reads them as ``parameters.headers``), and writes the engine's
reply bytes out as they are, with the request id (``request_context``) in ``x-request-id``.
The infer routes themselves are answered in front of Starlette, as raw ASGI
(``infer.py``). CORS (``cors_settings``), MLflow's root scoring routes
(``mlflow_scoring``) and KServe's V1 routes (``kserve_v1``) sit beside the V2 routes;
the access log and the tracer's spans (``access_log.RestObserver``) around them all when
on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from inferpool.engine.client import EngineClient
from inferpool.errors import BadRequest, InferpoolError
from inferpool.frontends.access_log import RestObserver
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.model_config import model_config
from inferpool.frontends.rest.answer import answer_response, header_pairs, refusal_lines
from inferpool.frontends.rest.body import read_body, scan_headers
from inferpool.frontends.rest.docs import docs_routes, route_entries
from inferpool.frontends.rest.endpoints import endpoint_routes
from inferpool.frontends.rest.gzip import GzipRoutes
from inferpool.frontends.rest.infer import InferRoutes
from inferpool.frontends.rest.key_guard import KeyGuard
from inferpool.frontends.rest.kserve_v1 import v1_routes
from inferpool.frontends.rest.mlflow_scoring import scoring_routes
from inferpool.frontends.rest.settings_routes import settings_routes
from inferpool.frontends.rest.shm_routes import shm_routes
from inferpool.frontends.rest.stream import stream_routes
from inferpool.protocol.rest_json import parse_json_object
from inferpool.settings import ServerSettings

if TYPE_CHECKING:
    from inferpool.frontends.api_keys import ApiKeys
    from inferpool.observability.tracing import RequestTracer

JSON = "application/json"
# A repository index request is a small JSON object; anything longer is refused (413).
INDEX_BODY_LIMIT = 64 * 1024


def json_response(document: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(document), status_code=status, media_type=JSON)


def error_response(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


def health_response(document: dict[str, Any], flag: str) -> Response:
    """A health document: 200 when its ``flag`` is true, else 503 (not 400, as Triton)."""
    return json_response(document, 200 if document[flag] else 503)


def inferpool_error_response(exc: InferpoolError) -> Response:
    response = error_response(exc.status, exc.message)
    response.raw_headers += header_pairs(refusal_lines(exc))
    return response


def build_app(
    client: EngineClient,
    tracer: RequestTracer | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    keys: ApiKeys | None = None,
) -> ASGIApp:
    """The ASGI app for one engine client: the data plane's answers as JSON.

    The infer routes are answered in front of Starlette (``infer.InferRoutes``); the
    middlewares (``middleware``), when any is on, wrap both. ``tracer``: the server's
    ``tracing.RequestTracer``, or None (tracing off). ``extra_routes``: appended to the
    V2 routes (``/metrics`` when it has no port of its own). ``keys``: the API keys
    every call but the probes must carry (``key_guard.py``), or None."""
    plane = DataPlane(client)
    stack = middleware(client.settings, tracer)
    gzip = client.settings.gzip_enabled

    async def live(request: Request) -> Response:
        return health_response(plane.live(), "live")

    async def ready(request: Request) -> Response:
        return health_response(plane.ready(), "ready")

    async def server_metadata(request: Request) -> Response:
        return json_response(plane.server_metadata())

    async def model_metadata(request: Request) -> Response:
        params = request.path_params
        return json_response(plane.model_metadata(params["name"], params.get("version")))

    async def model_ready(request: Request) -> Response:
        params = request.path_params
        return health_response(plane.model_ready(params["name"], params.get("version")), "ready")

    routes_in_front = InferRoutes(None, client, plane, direct=not stack)
    infer = routes_in_front.starlette_endpoint()

    async def config(request: Request) -> Response:
        params = request.path_params
        return json_response(model_config(client, params["name"], params.get("version")))

    async def repository_index(request: Request) -> Response:
        ready_only = await index_ready_flag(request)
        return json_response(plane.repository_index(ready_only))

    async def repository_load(request: Request) -> Response:
        await plane.load(request.path_params["name"], request.headers.get("authorization"))
        return Response(status_code=200)  # MLServer's empty body, no content type

    async def repository_unload(request: Request) -> Response:
        await plane.unload(request.path_params["name"], request.headers.get("authorization"))
        return Response(status_code=200)

    async def statistics(request: Request) -> Response:
        params = request.path_params
        return json_response(plane.statistics(params.get("name"), params.get("version")))

    model = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version}"
    routes: list[BaseRoute] = [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server_metadata),
        Route("/v2/models/stats", statistics),
        Route("/v2/repository/index", repository_index, methods=["POST", "GET"]),
        Route("/v2/repository/models/{name}/load", repository_load, methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", repository_unload, methods=["POST"]),
        *settings_routes(plane),  # Triton's trace and logging extensions
        *shm_routes(client),  # Triton's system shared-memory extension
    ]
    for prefix in (model, versioned):
        routes += [
            Route(prefix, model_metadata),
            Route(prefix + "/ready", model_ready),
            Route(prefix + "/infer", infer, methods=["POST"]),
            Route(prefix + "/stats", statistics),
            Route(prefix + "/config", config),
        ]
    # Streaming (SSE) and the generate extension, before the custom endpoints.
    routes += stream_routes(client, answer_response)
    # The OpenAPI documents and Swagger UI, over the final list of routes.
    routes += docs_routes(client, lambda: route_entries(routes))
    # MLflow's scoring server at the root, for a server of one model.
    routes += scoring_routes(plane)
    # KServe's V1 protocol (its sklearn, xgboost and lightgbm servers' default).
    routes += v1_routes(plane)
    # Runtime-registered endpoints last, so they never shadow a protocol route; a bare
    # path after everything else.
    feedback, endpoints, bare = endpoint_routes(plane, model, versioned)
    routes += [*feedback, *endpoints, *extra_routes, *bare]
    starlette: ASGIApp = Starlette(
        routes=routes,
        exception_handlers={InferpoolError: _inferpool_error, HTTPException: _http_error},
    )
    # MLServer's gzip_enabled for the routes Starlette answers (the infer routes in front
    # compress their own answers: gzip.py).
    routes_in_front.app = GzipRoutes(starlette, client.settings) if gzip else starlette
    app: ASGIApp = routes_in_front if keys is None else KeyGuard(routes_in_front, keys)
    for cls, args, kwargs in reversed(stack):
        app = cls(app, *args, **kwargs)
    return app


def middleware(settings: ServerSettings, tracer: RequestTracer | None = None) -> list[Middleware]:
    """CORS (outermost, so a preflight is answered before anything else) when
    ``cors_settings`` is set, and the access log and spans when asked for; none costs when
    off."""
    stack = []
    cors = settings.cors_settings
    if cors is not None:
        stack.append(Middleware(CORSMiddleware, **cors.model_dump()))
    if settings.access_log or tracer is not None:
        stack.append(Middleware(RestObserver, log=settings.access_log, tracer=tracer))
    return stack


async def index_ready_flag(request: Request) -> bool:
    """The repository index request's ``ready`` flag (V2 repository extension:
    ``{"ready": true}`` lists READY models only). A GET, or a POST with an empty body as
    tritonclient sends it, asks for every model; other members are ignored, as Triton does.
    """
    content_length, _, _, encoding, _, _ = scan_headers(request.scope["headers"])
    body = await read_body(request.receive, content_length, INDEX_BODY_LIMIT, encoding)
    if not body.strip():
        return False
    document = parse_json_object(body, "the repository index request")
    flag = document.get("ready", False)
    if not isinstance(flag, bool):
        raise BadRequest("'ready' in the repository index request must be true or false")
    return flag


async def _inferpool_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, InferpoolError)
    return inferpool_error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, str(exc.detail))
