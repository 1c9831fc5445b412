"""MLflow's scoring server at the root of a single-model server, or of its MLflow model:
``POST /invocations`` (JSON or CSV), ``GET /ping``, ``GET /health`` and ``GET /version``,
answering as ``mlflow models serve`` does, so MLflow's clients and probes work unchanged.

The body goes to the model's workers as a custom-endpoint call (``codecs.mlflow_scoring``
reads it there); this module only picks the endpoint from the Content-Type, as MLflow
checks it, and writes errors in MLflow's form (``{"error_code", "message"}``). In a server
of several models they answer for its only MLflow model, as MLServer's MLflow runtime
does; with none or several, 404 saying which to use instead.
"""

from __future__ import annotations

import importlib.metadata
import time

import orjson
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

import inferpool
from inferpool.engine.ipc.messages import Kind
from inferpool.engine.states import ModelState, ModelStatus
from inferpool.errors import InferpoolError, ModelNotFound
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.rest.body import read_body, request_timeout, scan_headers
from inferpool.frontends.rest.reply import await_reply
from inferpool.protocol.endpoints import call_body, read_answer
from inferpool.protocol.mlflow_endpoints import INVOCATIONS, INVOCATIONS_CSV

JSON = "application/json"
# Content-Type (without parameters) → the endpoint that reads it in the worker.
ENDPOINTS = {"application/json": INVOCATIONS, "text/csv": INVOCATIONS_CSV}
# MLflow's error codes (its databricks_pb2 names) for our statuses.
ERROR_CODES = {
    400: "BAD_REQUEST",
    404: "RESOURCE_DOES_NOT_EXIST",
    413: "BAD_REQUEST",
    499: "BAD_REQUEST",
    500: "INTERNAL_ERROR",
    503: "TEMPORARILY_UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def mlflow_error(status: int, message: str) -> Response:
    """An error as MLflow's scoring server writes one (``MlflowException`` as JSON)."""
    code = ERROR_CODES.get(status, "BAD_REQUEST" if status < 500 else "INTERNAL_ERROR")
    body = orjson.dumps({"error_code": code, "message": message})
    return Response(body, status_code=status, media_type=JSON)


def server_version() -> str:
    """MLflow's version where it is installed (what ``/version`` tells MLflow's clients),
    else inferpool's."""
    for distribution in ("mlflow", "mlflow-skinny"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return inferpool.__version__


def scoring_routes(plane: DataPlane) -> list[Route]:
    """The four root routes over one data plane."""
    client = plane.client
    settings = client.settings
    version = server_version()

    def the_model() -> ModelStatus:
        statuses = client.table.all()
        names = sorted({status.name for status in statuses})
        if len(names) == 1:
            return client.table.find(names[0])
        # As MLServer, whose MLflow runtime registers these routes at the root: the
        # server's MLflow model answers them, whatever other models it serves.
        flavoured = sorted({s.name for s in statuses if s.metadata.get("platform") == "mlflow"})
        if len(flavoured) == 1:
            return client.table.find(flavoured[0])
        served = f"{len(names)} models ({', '.join(names)})" if names else "no model"
        mlflow = f"{len(flavoured)} of them MLflow models" if flavoured else "none of them MLflow's"
        raise ModelNotFound(
            f"MLflow's scoring endpoints answer for the server's only model or its only MLflow "
            f"model; this one serves {served}, {mlflow}: use /v2/models/{{name}}/invocations"
        )

    async def ping(request: Request) -> Response:
        try:
            status = the_model()
        except InferpoolError as exc:
            return mlflow_error(exc.status, exc.message)
        if status.state is not ModelState.READY:
            return mlflow_error(503, status.describe())
        return Response("\n", media_type=JSON)

    async def version_route(request: Request) -> Response:
        try:
            the_model()
        except InferpoolError as exc:
            return mlflow_error(exc.status, exc.message)
        return Response(version, media_type=JSON)

    async def invocations(request: Request) -> Response:
        try:
            endpoint = _endpoint(request.headers.get("content-type"))
        except _Unsupported as exc:
            return PlainTextResponse(str(exc), status_code=415)
        scope = request.scope
        try:
            name = the_model().name
            content_length, _, timeout_header, encoding, _, _ = scan_headers(scope["headers"])
            timeout = request_timeout(timeout_header, settings.request_timeout)
            body = await read_body(
                request.receive, content_length, settings.max_body_bytes, encoding
            )
            deadline = None if timeout is None else time.monotonic() + timeout
            call = plane.infer(name, None, Kind.CUSTOM, call_body(endpoint, body), None, deadline)
            reply = await await_reply(scope, request.receive, call, timeout)
        except InferpoolError as exc:
            return mlflow_error(exc.status, exc.message)
        answer = read_answer(reply.body, reply.json_length)
        if answer is None:  # the worker's error
            return mlflow_error(reply.status, reply.body.decode("utf-8", "replace"))
        return Response(answer[1], status_code=reply.status, media_type=JSON)

    return [
        Route("/ping", ping),
        Route("/health", ping),
        Route("/version", version_route),
        Route("/invocations", invocations, methods=["POST"]),
    ]


class _Unsupported(Exception):
    """A Content-Type the scoring server refuses (415, in MLflow's plain-text words)."""


def _endpoint(content_type: str | None) -> str:
    """The endpoint for a Content-Type, checked as MLflow's scoring server checks it."""
    parts = [part.strip() for part in (content_type or "").split(";")]
    mime = parts[0].lower()
    parameters = dict(part.partition("=")[::2] for part in parts[1:])
    if parameters.get("charset", "utf-8").lower() != "utf-8":
        raise _Unsupported("The scoring server only supports UTF-8")
    unexpected = set(parameters) - {"charset"}
    if unexpected:
        raise _Unsupported(
            f"Unrecognized content type parameters: {', '.join(sorted(unexpected))}."
        )
    endpoint = ENDPOINTS.get(mime)
    if endpoint is None:
        raise _Unsupported(
            f"This predictor only supports the following content types: Types: "
            f"{list(ENDPOINTS)}. Got '{content_type or ''}'."
        )
    return endpoint
