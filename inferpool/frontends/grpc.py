"""The V2 gRPC service (``inference.GRPCInferenceService``) and its grpc.aio server.

``InferenceService`` implements the RPCs once; two servers carry it: ``GrpcServer`` here
(grpc.aio, ``--grpc-implementation grpcio``) and ``grpc_h2.GrpcH2Server`` (inferpool's
own HTTP/2, the default).

ModelInfer goes through a generic handler that keeps the request as raw bytes: the
frontend reads only ``model_name`` (field 1) and ``model_version`` (field 2) with a tiny
protobuf field scanner and hands the bytes to wherever the model runs, which answers with
serialized ModelInferResponse bytes. The other RPCs are small and use the generated
messages. Errors carry the same messages as REST, with the matching gRPC status code.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format

import inferpool
from inferpool.engine.admin import authorization_of
from inferpool.engine.client import EngineClient
from inferpool.engine.states import ModelState
from inferpool.engine.worker.handler import KIND_GRPC
from inferpool.errors import BadRequest, InferpoolError, Overloaded, from_status, grpc_code_for
from inferpool.frontends.access_log import log_request
from inferpool.frontends.rest import EXTENSIONS
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.grpc_wire import set_parameters
from inferpool.settings import ServerSettings

logger = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
# Triton's default: messages as large as gRPC allows, so big raw batches fit.
MAX_MESSAGE_BYTES = 2**31 - 1
# How long an overloaded server asks clients to wait, as REST's Retry-After: 1.
RETRY_AFTER_MS = "1000"

Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


# -- routing: the model name and version, read straight from the request bytes ------------
def read_route(body: bytes) -> tuple[str, str | None]:
    """``model_name`` and ``model_version`` of a serialized ModelInferRequest.

    Walks the top-level fields only, skipping each by its length; as protobuf parsing
    does, the last occurrence of a field wins. An empty version means "any version".
    """
    fields: dict[int, bytes] = {}
    pos, end = 0, len(body)
    while pos < end:
        key, pos = _varint(body, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise _malformed()
        if wire_type == 0:
            _, pos = _varint(body, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 2:
            length, pos = _varint(body, pos)
            if number in (1, 2):
                fields[number] = body[pos : pos + length]
            pos += length
        elif wire_type == 5:
            pos += 4
        else:
            raise _malformed()
    if pos != end:
        raise _malformed()
    try:
        name = fields.get(1, b"").decode()
        version = fields.get(2, b"").decode()
    except UnicodeDecodeError:
        raise _malformed() from None
    if not name:
        raise BadRequest("ModelInferRequest has no model_name")
    return name, version or None


def _varint(body: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(body) and shift < 64:
        byte = body[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise _malformed()


def _malformed() -> BadRequest:
    return BadRequest("request body is not a valid inference.ModelInferRequest")


# -- the service ------------------------------------------------------------------------
class InferenceService:
    """The RPCs of GRPCInferenceService over one engine client."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client

    async def model_infer(self, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        remaining = context.time_remaining()
        deadline = time.monotonic() + remaining if remaining is not None else None
        return await self.infer(body, deadline)

    async def infer(self, body: bytes, deadline: float | None) -> bytes:
        """ModelInfer on raw bytes: serialized ModelInferResponse, or raises with the status.

        ``deadline`` is a ``time.monotonic()`` instant, or None.
        """
        name, version = read_route(body)
        reply = await self.client.infer(name, version, KIND_GRPC, body, None, deadline=deadline)
        if reply.status != 200:
            raise from_status(reply.status, reply.body.decode("utf-8", "replace"))
        return reply.body

    async def server_live(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.client.live)

    async def server_ready(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.client.not_ready_reason() is None)

    async def model_ready(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        status = self.client.table.find(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=status.state is ModelState.READY)

    async def server_metadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name="inferpool", version=inferpool.__version__, extensions=EXTENSIONS
        )

    async def model_metadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        status = self.client.table.find(request.name, request.version or None)
        metadata = status.metadata
        response = pb.ModelMetadataResponse(
            name=status.name,
            versions=metadata.get("versions") or ([status.version] if status.version else []),
            platform=metadata.get("platform", ""),
        )
        set_parameters(response.parameters, metadata.get("parameters") or {})
        for specs, target in (
            (metadata.get("inputs", []), response.inputs),
            (metadata.get("outputs", []), response.outputs),
        ):
            for spec in specs:
                tensor = target.add(
                    name=spec["name"], datatype=spec["datatype"], shape=spec["shape"]
                )
                set_parameters(tensor.parameters, spec.get("parameters") or {})
        return response

    async def model_statistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        document = self.client.statistics(request.name or None, request.version or None)
        return json_format.ParseDict(document, pb.ModelStatisticsResponse())

    async def repository_index(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for status in self.client.table.all():
            if request.ready and status.state is not ModelState.READY:
                continue
            response.models.add(
                name=status.name,
                version=status.version or "",
                state=status.state.value,
                reason=status.reason,
            )
        return response

    async def repository_model_load(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        self.require_admin(context)
        await self.client.load_model(request.model_name)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        self.require_admin(context)
        await self.client.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    def require_admin(self, context: Any) -> None:
        """An admin RPC's guard: UNAUTHENTICATED without the admin token (``authorization:
        Bearer TOKEN`` metadata), PERMISSION_DENIED if the repository API is disabled."""
        metadata = context.invocation_metadata() if context is not None else None
        self.client.admin.require(authorization_of(metadata))


class HeadersContext:
    """The part of grpc.aio's ServicerContext that typed handlers use, over a call's
    HTTP/2 headers (the builtin implementation): ``invocation_metadata()``."""

    __slots__ = ("_headers",)

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self._headers = headers

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """Every header but the pseudo-headers, as (key, value) strings."""
        return tuple(
            (key.decode("latin-1"), value.decode("latin-1"))
            for key, value in self._headers
            if not key.startswith(b":")
        )


def model_of(request: Any) -> str:
    """The model a request names, for the access log."""
    if isinstance(request, bytes):
        try:
            return read_route(request)[0]
        except InferpoolError:
            return "-"
    for field in ("model_name", "name"):
        value = getattr(request, field, "")
        if value:
            return value
    return "-"


def call_status(exc: Exception, method: str) -> tuple[str, str, bool]:
    """The status a call that raised ``exc`` ends with: (code name, message, pushback).

    ``pushback`` asks for gRPC's form of Retry-After (``grpc-retry-pushback-ms``), which
    clients with a retry policy honour. Anything but an InferpoolError is logged: a bug.
    """
    if isinstance(exc, InferpoolError):
        return grpc_code_for(exc.status), exc.message, isinstance(exc, Overloaded)
    logger.exception("gRPC %s failed", method)
    return "INTERNAL", f"internal error: {type(exc).__name__}: {exc}", False


def guarded(method: str, handler: Handler, access_log: bool) -> Handler:
    """``handler`` with errors turned into gRPC statuses, and the access log if asked."""

    async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return await handler(request, context)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED  # the client went away or its deadline passed
            raise
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            name, message, pushback = call_status(exc, method)
            code = grpc.StatusCode[name]
            if pushback:
                context.set_trailing_metadata((("grpc-retry-pushback-ms", RETRY_AFTER_MS),))
            await context.abort(code, message)
        finally:
            if access_log:
                log_request("gRPC", method, model_of(request), code.name, started)

    return run


def typed_methods(service: InferenceService) -> dict[str, tuple[Handler, Any]]:
    """Every RPC but ModelInfer: name → (handler(request, context), request message)."""
    return {
        "ServerLive": (service.server_live, pb.ServerLiveRequest),
        "ServerReady": (service.server_ready, pb.ServerReadyRequest),
        "ModelReady": (service.model_ready, pb.ModelReadyRequest),
        "ServerMetadata": (service.server_metadata, pb.ServerMetadataRequest),
        "ModelMetadata": (service.model_metadata, pb.ModelMetadataRequest),
        "ModelStatistics": (service.model_statistics, pb.ModelStatisticsRequest),
        "RepositoryIndex": (service.repository_index, pb.RepositoryIndexRequest),
        "RepositoryModelLoad": (service.repository_model_load, pb.RepositoryModelLoadRequest),
        "RepositoryModelUnload": (
            service.repository_model_unload,
            pb.RepositoryModelUnloadRequest,
        ),
    }


def build_handler(client: EngineClient, access_log: bool = False) -> grpc.GenericRpcHandler:
    """The generic handler serving GRPCInferenceService for one engine client (grpc.aio)."""
    service = InferenceService(client)
    methods = {
        name: grpc.unary_unary_rpc_method_handler(
            guarded(name, handler, access_log),
            request_deserializer=message.FromString,
            response_serializer=_serialize,
        )
        for name, (handler, message) in typed_methods(service).items()
    }
    # No (de)serializers: the request and the reply stay bytes.
    methods["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        guarded("ModelInfer", service.model_infer, access_log)
    )
    return grpc.method_handlers_generic_handler(SERVICE, methods)


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()


class GrpcServer:
    """grpc.aio on the server's loop; stopping lets in-flight calls finish first."""

    def __init__(
        self, client: EngineClient, settings: ServerSettings, connections: Any = None
    ) -> None:
        # ``connections`` (the shared registry) cannot see grpc.aio's connections: C-core
        # accepts them itself. Its own options bound them instead (grpc_options).
        self.settings = settings
        self.server = grpc.aio.server(options=grpc_options(settings))
        self.server.add_generic_rpc_handlers((build_handler(client, settings.access_log),))
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        address = f"{host}:{settings.grpc_port}"
        try:
            bound = self.server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise OSError(f"cannot listen on {address} for gRPC")

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        """Refuse new calls; in-flight calls get the shutdown grace period to finish."""
        await self.server.stop(self.settings.shutdown_timeout)


def grpc_options(settings: ServerSettings) -> list[tuple[str, int]]:
    """grpc.aio's equivalents of the builtin HTTP/2 layer's limits and timeouts."""
    options = [
        ("grpc.max_receive_message_length", settings.max_body_bytes),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_concurrent_streams", settings.max_concurrent_streams),
        ("grpc.max_metadata_size", settings.max_header_bytes),
        ("grpc.absolute_max_metadata_size", settings.max_header_bytes),
        # Pings without data in between: at most one per 10 s, the third strike ends the
        # connection with GOAWAY ENHANCE_YOUR_CALM (grpc's ping-flood defence).
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 2),
        # A port that is taken must fail to bind, not be shared with its owner.
        ("grpc.so_reuseport", 0),
    ]
    if settings.idle_timeout > 0:
        options.append(("grpc.max_connection_idle_ms", int(settings.idle_timeout * 1000)))
    if settings.handshake_timeout > 0:
        options.append(("grpc.server_handshake_timeout_ms", int(settings.handshake_timeout * 1000)))
    return options
