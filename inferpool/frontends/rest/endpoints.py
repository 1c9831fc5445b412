"""The REST routes of custom endpoints and feedback.

``/v2/models/{name}[/versions/{v}]/{path}`` (any number of segments) calls a runtime's
endpoint with the request's method, query string, headers and body; ``/{path}`` at the
root does the same for the one model whose runtime serves its endpoints bare
(``Runtime.bare_endpoints``); ``POST /v2/models/{name}[/versions/{v}]/feedback`` hands a
feedback to the runtime's ``feedback`` hook. The answer is the handler's status, content
type, headers and body, with the request id in ``x-request-id``; errors are
``{"error": ...}`` with their status (405 with ``Allow``). Routing and counting are
``endpoints.EndpointRouter``'s.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from inferpool.engine.ipc.messages import Reply
from inferpool.engine.states import ModelStatus
from inferpool.errors import InferpoolError
from inferpool.frontends.access_log import REPLY
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.endpoints import EndpointRouter, endpoint_path, headers_of
from inferpool.frontends.request_context import HEADER_BYTES
from inferpool.frontends.rest.answer import answer_response, answered, failed
from inferpool.frontends.rest.body import read_request
from inferpool.frontends.rest.ids import final_id
from inferpool.frontends.rest.reply import await_reply
from inferpool.protocol.endpoints import FEEDBACK_JSON, MethodNotAllowed, read_answer


def endpoint_routes(plane: DataPlane, model: str, versioned: str) -> tuple[list[Route], ...]:
    """(the feedback routes, to sit with the protocol's, the model routes of custom
    endpoints, to come after every protocol route, and the bare route, to come last)."""
    router = EndpointRouter(plane)
    settings = plane.client.settings
    max_body, default_timeout = settings.max_body_bytes, settings.request_timeout

    async def read(request: Request) -> tuple[bytes, float | None, float | None]:
        """The body, the timeout and the deadline; the request id taken from its header."""
        body, _, timeout = await read_request(
            request.scope, request.receive, max_body, default_timeout
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        return body, timeout, deadline

    async def serve(request: Request, find: Any) -> Response:
        scope = request.scope
        method = request.method
        try:
            path = scope["path_params"]["path"]
            status: ModelStatus = find(path, method)
            path = endpoint_path(path)
            body, timeout, deadline = await read(request)
            query = scope.get("query_string", b"").decode("latin-1")
            headers = headers_of(scope["headers"])
            call = router.call(status, path, method, query, headers, body, deadline)
            reply = await await_reply(scope, request.receive, call, timeout)
        except InferpoolError as exc:
            return error(scope, exc)
        router.count(status, "rest", path, method, reply)
        return answer(scope, reply)

    async def model_endpoint(request: Request) -> Response:
        params = request.path_params
        name, version = params["name"], params.get("version")

        def find(path: str, method: str) -> ModelStatus:
            refuse_other_method(request.scope)
            return router.route(name, version, endpoint_path(path), method)

        return await serve(request, find)

    async def bare_endpoint(request: Request) -> Response:
        def find(path: str, method: str) -> ModelStatus:
            refuse_other_method(request.scope)
            return router.bare(endpoint_path(path), method)

        return await serve(request, find)

    async def feedback(request: Request) -> Response:
        params = request.path_params
        name, version = params["name"], params.get("version")
        scope = request.scope
        try:
            body, timeout, deadline = await read(request)
            call = router.feedback(name, version, FEEDBACK_JSON, body, deadline)
            reply = await await_reply(scope, request.receive, call, timeout)
        except InferpoolError as exc:
            return error(scope, exc)
        router.count_feedback(name, version, reply)
        return answer(scope, reply)

    every = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    feedback_routes = [
        Route(prefix + "/feedback", feedback, methods=["POST"]) for prefix in (model, versioned)
    ]
    model_routes = [
        Route(versioned + "/{path:path}", model_endpoint, methods=every),
        Route(model + "/{path:path}", model_endpoint, methods=every),
    ]
    return feedback_routes, model_routes, [Route("/{path:path}", bare_endpoint, methods=every)]


def refuse_other_method(scope: Any) -> None:
    """405 with ``Allow`` for a route of the protocol's asked with another method: the
    catch-all routes here answer every method, so Starlette's own 405 never comes."""
    router = scope.get("router")
    for route in router.routes if router is not None else ():
        if isinstance(route, Route) and route.matches(scope)[0] is Match.PARTIAL:
            methods = sorted(route.methods or ())
            raise MethodNotAllowed(f"{scope['method']} is not allowed here", methods)


def answer(scope: Any, reply: Reply) -> Response:
    """The handler's answer (or the worker's error) with the request id."""
    request_id = final_id(scope)
    scope[REPLY] = reply
    handled = read_answer(reply.body, reply.json_length)
    if handled is None:  # the worker's error: its message
        return answer_response(answered(scope, reply))
    head, body = handled
    response = Response(body, status_code=reply.status, media_type=None)
    response.raw_headers = [
        (b"content-type", head.content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode()),
        (HEADER_BYTES, request_id.encode()),
        *((name.encode("latin-1"), value.encode("latin-1")) for name, value in head.headers),
    ]
    return response


def error(scope: Any, exc: InferpoolError) -> Response:
    response = answer_response(failed(scope, exc))
    if isinstance(exc, MethodNotAllowed) and exc.allow:
        response.raw_headers.append((b"allow", exc.allow.encode()))
    return response
