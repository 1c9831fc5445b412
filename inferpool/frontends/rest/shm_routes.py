"""REST routes of Triton's system shared-memory extension (``engine/shared_memory.py``):
``GET /v2/systemsharedmemory/status`` and ``.../region/{name}/status``, ``POST
.../region/{name}/register`` (body ``{"key", "offset", "byte_size"}``), ``POST
.../region/{name}/unregister`` and ``POST /v2/systemsharedmemory/unregister`` (every
region). The ``/v2/cudasharedmemory`` routes answer 400: CUDA shared memory is not served.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from inferpool.engine.client import EngineClient
from inferpool.engine.shared_memory import CudaUnsupported
from inferpool.frontends.rest.body import read_body, scan_headers
from inferpool.protocol.rest_json import parse_json_object

# A registration is three small members; anything longer is refused (413).
BODY_LIMIT = 64 * 1024
SYSTEM = "/v2/systemsharedmemory"
CUDA = "/v2/cudasharedmemory"


def _json(document: Any) -> Response:
    return Response(orjson.dumps(document), media_type="application/json")


def shm_routes(client: EngineClient) -> list[BaseRoute]:
    registry = client.shared_memory

    async def status(request: Request) -> Response:
        return _json(registry.status(request.path_params.get("name")))

    async def register(request: Request) -> Response:
        content_length, _, _, encoding, _, _ = scan_headers(request.scope["headers"])
        body = await read_body(request.receive, content_length, BODY_LIMIT, encoding)
        document = parse_json_object(body, "the registration")
        name = request.path_params["name"]
        registry.register(
            name, document.get("key"), document.get("offset", 0), document.get("byte_size")
        )
        return Response(status_code=200)

    async def unregister(request: Request) -> Response:
        registry.unregister(request.path_params.get("name"))
        return Response(status_code=200)

    async def cuda(request: Request) -> Response:
        raise CudaUnsupported()

    region = "/region/{name}"
    post = ["POST"]
    return [
        Route(SYSTEM + "/status", status),
        Route(SYSTEM + region + "/status", status),
        Route(SYSTEM + region + "/register", register, methods=post),
        Route(SYSTEM + region + "/unregister", unregister, methods=post),
        Route(SYSTEM + "/unregister", unregister, methods=post),
        Route(CUDA + "/status", cuda),
        Route(CUDA + region + "/status", cuda),
        Route(CUDA + region + "/register", cuda, methods=post),
        Route(CUDA + region + "/unregister", cuda, methods=post),
        Route(CUDA + "/unregister", cuda, methods=post),
    ]
