"""REST routes of Triton's ``trace`` and ``logging`` extensions (``runtime_settings``):
``GET``/``POST /v2/trace/setting``, ``/v2/models/{name}/trace/setting`` and
``/v2/logging``. A GET reads the settings; a POST, whose body is a JSON object of the
settings to change, is an admin action (the admin token, when one is set) and answers the
settings after the change."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.rest.body import read_body, scan_headers
from inferpool.frontends.runtime_settings import log_settings, trace_settings
from inferpool.protocol.rest_json import parse_json_object

# A settings document is a few small members; anything longer is refused (413).
BODY_LIMIT = 64 * 1024


def _json(document: Any) -> Response:
    return Response(orjson.dumps(document), media_type="application/json")


async def _changes(request: Request) -> dict[str, Any] | None:
    """A POST's settings to change (an empty body: none); None for a GET."""
    if request.method != "POST":
        return None
    content_length, _, _, encoding, _, _ = scan_headers(request.scope["headers"])
    body = await read_body(request.receive, content_length, BODY_LIMIT, encoding)
    if not body.strip():
        return {}
    return parse_json_object(body, "the settings")


def settings_routes(plane: DataPlane) -> list[BaseRoute]:
    async def trace(request: Request) -> Response:
        model = request.path_params.get("name")
        changes = await _changes(request)
        authorization = request.headers.get("authorization")
        return _json(trace_settings(plane, changes, model, authorization))

    async def logging_settings(request: Request) -> Response:
        changes = await _changes(request)
        return _json(log_settings(plane, changes, request.headers.get("authorization")))

    methods = ["GET", "POST"]
    return [
        Route("/v2/trace/setting", trace, methods=methods),
        Route("/v2/models/{name}/trace/setting", trace, methods=methods),
        Route("/v2/logging", logging_settings, methods=methods),
    ]
