"""KServe's V1 REST protocol, answered as KServe's sklearn, xgboost and lightgbm servers
answer it: ``GET /`` (``{"status": "alive"}``), ``GET /v1/models`` (``{"models": [...]}``),
``GET /v1/models/{name}`` (``{"name", "ready": true}``; 503 when not ready),
``POST /v1/models/{name}:predict`` and ``POST /v1/models/{name}:explain``.

The two POST routes are the inference path: the raw body goes to a worker of the model as
an internal custom-endpoint call (``protocol/kserve_v1.py`` names it), where it becomes the
model's V2 request and its answer KServe's JSON (``engine/worker/kserve_v1.py``). This
module only routes and writes KServe's errors: ``{"error": ...}`` with 404 for an unknown
model and 503 for one that is not ready, in KServe's sentences.
"""

from __future__ import annotations

import time

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferpool.engine.ipc.messages import Kind
from inferpool.engine.states import ModelState, ModelStatus
from inferpool.errors import InferpoolError, ModelNotFound, NotReady
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.rest.body import read_request
from inferpool.frontends.rest.endpoints import answer, error
from inferpool.frontends.rest.reply import await_reply
from inferpool.protocol import kserve_v1 as protocol
from inferpool.protocol.endpoints import call_body

JSON = "application/json"


def _json(document: object, status: int = 200) -> Response:
    return Response(orjson.dumps(document), status_code=status, media_type=JSON)


def v1_routes(plane: DataPlane) -> list[Route]:
    """The V1 routes over one data plane."""
    v1 = _V1(plane)
    return [
        Route("/", v1.alive),
        Route("/v1/models", v1.models),
        # Before the readiness route: "{name}" would take ":predict" in too.
        Route("/v1/models/{name}:predict", v1.predict, methods=["POST"]),
        Route("/v1/models/{name}:explain", v1.explain, methods=["POST"]),
        Route("/v1/models/{name}", v1.model_ready),
    ]


class _V1:
    """The handlers, over one data plane."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.client = plane.client

    def ready_model(self, name: str) -> ModelStatus:
        """The model if READY; KServe's 404 when unknown, its 503 (with inferpool's
        reason) when not ready."""
        try:
            status = self.client.table.find(name)
        except ModelNotFound:
            raise ModelNotFound(protocol.not_found(name)) from None
        if status.state is not ModelState.READY:
            raise NotReady(protocol.not_ready(name, status.describe()))
        return status

    async def alive(self, request: Request) -> Response:
        return _json({"status": "alive"})

    async def models(self, request: Request) -> Response:
        names = sorted({status.name for status in self.client.table.all()})
        return _json({"models": names})

    async def model_ready(self, request: Request) -> Response:
        name = request.path_params["name"]
        self.client.pipelines.sync()  # a pipeline is ready when its children are
        try:
            self.ready_model(name)
        except InferpoolError as exc:
            return _json({"error": exc.message}, exc.status)
        return _json({"name": name, "ready": True})

    async def predict(self, request: Request) -> Response:
        return await self.call(request, protocol.PREDICT)

    async def explain(self, request: Request) -> Response:
        return await self.call(request, protocol.EXPLAIN)

    async def call(self, request: Request, path: str) -> Response:
        """The body to a worker of the model as the internal endpoint ``path``."""
        scope, settings = request.scope, self.client.settings
        try:
            status = self.ready_model(request.path_params["name"])
            body, _, timeout = await read_request(
                scope, request.receive, settings.max_body_bytes, settings.request_timeout
            )
            deadline = None if timeout is None else time.monotonic() + timeout
            payload = call_body(path, body)
            engine = self.plane.infer(
                status.name, status.version, Kind.CUSTOM, payload, None, deadline
            )
            reply = await await_reply(scope, request.receive, engine, timeout)
        except InferpoolError as exc:
            return error(scope, exc)
        return answer(scope, reply)
