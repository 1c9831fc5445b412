"""The V2 gRPC servicer: the data plane's answers as protobuf messages, and what both
gRPC servers share (routing from raw bytes, the status a failed call ends with).

ModelInfer keeps the request as raw bytes: the frontend reads only ``model_name`` (field
1), ``model_version`` (field 2) and ``id`` (field 3, for the request id: see
``request_context``) with a tiny protobuf field scanner and hands the bytes to wherever the
model runs, which answers with serialized ModelInferResponse bytes. The other RPCs are
small and use the generated messages. Errors carry the same messages as REST, with the
matching gRPC status code.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextvars import ContextVar
from typing import Any

from google.protobuf import json_format

from inferpool.engine.admin import authorization_of
from inferpool.engine.ipc.messages import Kind, Reply
from inferpool.engine.shared_memory import MARKER
from inferpool.errors import (
    BadRequest,
    InferpoolError,
    Overloaded,
    RateLimited,
    from_status,
)
from inferpool.frontends.api_keys import (
    ADMIN_METHODS,
    KEY_RATE_LIMIT,
    OPEN_METHODS,
    REGION_METHODS,
    ApiKeys,
)
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.grpc.settings_rpc import SettingsRpc
from inferpool.frontends.grpc.shm_rpc import SharedMemoryRpc
from inferpool.frontends.grpc.stream_input import stream_messages
from inferpool.frontends.grpc.stream_message import (
    speaks_mlserver,
)
from inferpool.frontends.metrics_server import OVERLOAD, count_rejected
from inferpool.frontends.model_config import model_config
from inferpool.frontends.request_context import checked, echoed_grpc_id, from_metadata, generate
from inferpool.protocol.endpoints import Announced
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.grpc_wire import set_parameters
from inferpool.protocol.priority import HEADER, LEVEL, header_level
from inferpool.protocol.protowire import scan_fields
from inferpool.protocol.request_headers import grpc_metadata, unwrap, wrap
from inferpool.request_ids import current_request_id

logger = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"

# A typed RPC: (request message, context) → response message.
Handler = Callable[[Any, Any], Awaitable[Any]]


# -- routing: the model name and version, read straight from the request bytes ------------
_ROUTE_FIELDS = frozenset((1, 2, 3))  # model_name, model_version, id
# The trailing metadata a ModelInfer call ends with beside its x-request-id: the headers
# its response set (a custom runtime's parameters.headers), as ``trailing_metadata`` has
# them; set by ``infer``, read by the server that ends the call (aio.py, h2.py).
response_metadata: ContextVar[tuple[tuple[str, str], ...]] = ContextVar(
    "inferpool_response_metadata", default=()
)
# gRPC's metadata key alphabet, a printable ASCII value, and the call's own headers.
_METADATA_KEY = re.compile(r"[0-9a-z_.-]+")
_METADATA_VALUE = re.compile(r"[\x20-\x7e]*")
_CALL_HEADERS = frozenset({"content-type", "te", "user-agent", "x-request-id"})


def read_infer_request(body: bytes) -> tuple[str, str | None, str | None]:
    """``model_name``, ``model_version`` and ``id`` of a serialized ModelInferRequest.

    Walks the top-level fields only, skipping each by its length; as protobuf parsing
    does, the last occurrence of a field wins. An empty version means "any version", an
    empty id none.
    """
    try:
        fields = scan_fields(body, _ROUTE_FIELDS)
    except ValueError:
        raise _malformed() from None
    try:
        name = fields.get(1, b"").decode()
        version = fields.get(2, b"").decode()
        request_id = fields.get(3, b"").decode()
    except UnicodeDecodeError:
        raise _malformed() from None
    if not name:
        raise BadRequest("ModelInferRequest has no model_name")
    return name, version or None, request_id or None


def read_route(body: bytes) -> tuple[str, str | None]:
    """``model_name`` and ``model_version`` of a serialized ModelInferRequest."""
    name, version, _ = read_infer_request(body)
    return name, version


def _malformed() -> BadRequest:
    return BadRequest("request body is not a valid inference.ModelInferRequest")


# -- the service ------------------------------------------------------------------------
class InferenceService:
    """The RPCs of GRPCInferenceService over one data plane. ``context`` is grpc.aio's
    ServicerContext or anything with its ``invocation_metadata()`` (the admin RPCs read
    the ``authorization`` metadata there)."""

    def __init__(self, plane: DataPlane, keys: ApiKeys | None = None) -> None:
        self.plane = plane
        self.settings = SettingsRpc(plane)
        self.shared_memory = SharedMemoryRpc(plane.client)
        self.keys = keys  # the API keys calls must carry (api_keys.py), or None

    async def model_infer(self, body: bytes, context: Any) -> Reply:
        """ModelInfer under grpc.aio: the deadline and the metadata from the context."""
        remaining = context.time_remaining()
        deadline = time.monotonic() + remaining if remaining is not None else None
        metadata = context.invocation_metadata()
        given = from_metadata(metadata)
        priority = next((value for name, value in metadata or () if name == HEADER), None)
        return await self.infer(body, deadline, context, given, priority)

    async def infer(
        self,
        body: bytes,
        deadline: float | None,
        metadata: Any = None,
        given: str | None = None,
        priority: bytes | str | None = None,
    ) -> Reply:
        """ModelInfer on raw bytes: the engine's reply, whatever its status (``ok_body``
        turns it into the response bytes or the call's error).

        ``deadline`` is a ``time.monotonic()`` instant, or None. ``metadata`` is the call's:
        grpc.aio's context or the HTTP/2 layer's header list; read only for a custom
        runtime, which gets it as ``parameters.headers``. ``given`` is its ``x-request-id``,
        if any; ``priority`` its ``inferpool-priority`` metadata value, if any (the
        dispatcher reads its level: ``protocol/priority.py``). The resolved request id is
        in ``current_request_id`` once known
        (``request_context``): at arrival from ``given`` or the request's ``id``, else from
        the reply's ``id``, else generated (``infer_request_id``).
        """
        settle_id(None)  # this call's own, whatever ran in this task before
        name, version, request_id = read_infer_request(body)
        if given is not None:
            request_id = checked(given)
        if request_id is not None:
            settle_id(request_id)
        level = 0 if priority is None else header_level(priority)
        kind: int = Kind.GRPC
        client = self.plane.client
        exchanges = client.table.find(name, version).exchanges_headers
        if exchanges:
            body = wrap(grpc_metadata(_call_metadata(metadata)), body)
            kind = Kind.GRPC_HEADERS
        if client.shared_memory.regions and MARKER in body:  # tensors in shared memory
            kind, body = client.shared_memory.tagged(kind, body)
        if level:  # for the dispatcher, in this call only
            token = LEVEL.set(level)
            try:
                reply = await self.plane.infer(name, version, kind, body, None, deadline)
            finally:
                LEVEL.reset(token)
        else:
            reply = await self.plane.infer(name, version, kind, body, None, deadline)
        response_metadata.set(())
        if exchanges and reply.status == 200:
            headers, reply.body = unwrap(reply.body, view=True)  # framed copies it once
            response_metadata.set(trailing_metadata(headers))
        if request_id is None:
            settle_id((reply.status == 200 and echoed_grpc_id(reply.body)) or generate())
        return reply

    async def stream_infer(
        self, requests: AsyncIterator[bytes], deadline: float | None, metadata: Any = ()
    ) -> AsyncIterator[bytes]:
        """ModelStreamInfer on raw bytes, both servers: each ModelInferRequest in turn,
        answered by serialized messages, one per chunk of a model that streams
        (``predict_stream``), else one: Triton's ModelStreamInferResponse or MLServer's
        ModelInferResponse, as ``stream_message.speaks_mlserver`` chooses at the first
        request. With Triton's, a request's error is one message with ``error_message`` set
        and the stream goes on with the next request; with MLServer's it ends the call.
        A first request to a model whose runtime takes the whole stream (MLServer's
        ``predict_stream``) streams the call to it instead (``stream_input.py``).
        ``deadline`` (a ``time.monotonic()`` instant, or None) is the whole call's;
        ``metadata`` its metadata pairs (for the API key, each request's model checked)."""
        client = self.plane.client
        mlserver: bool | None = None  # the call's message (stream_message.py), at its first
        async for body in requests:
            if self.keys is not None:
                check_key(self.keys, "ModelStreamInfer", body, metadata)
            rest = None  # the call's later requests, when they go to the same predict_stream
            if mlserver is None:
                setting = client.settings.grpc_stream_response
                endpoints = self._endpoints(body)
                mlmodel = None if endpoints is None else endpoints.mlserver
                mlserver = speaks_mlserver(setting, body, mlmodel)
                if endpoints is not None and endpoints.stream_input:
                    rest = requests
            answers = stream_messages(client, body, read_infer_request, deadline, mlserver, rest)
            async for message in answers:
                yield message
            if rest is not None:
                return

    def _endpoints(self, body: bytes) -> Announced | None:
        """What the request's model announced (an MLServer custom runtime, one that takes
        a whole stream); None: no such model."""
        try:
            name, version, _ = read_infer_request(body)
            return self.plane.client.table.find(name, version).endpoints
        except InferpoolError:
            return None

    async def server_live(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.plane.live()["live"])

    async def server_ready(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.ready()["ready"])

    async def model_ready(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        document = self.plane.model_ready(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=document["ready"])

    async def server_metadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**self.plane.server_metadata())

    async def model_metadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        document = self.plane.model_metadata(request.name, request.version or None)
        response = pb.ModelMetadataResponse(
            name=document["name"], versions=document["versions"], platform=document["platform"]
        )
        set_parameters(response.parameters, document.get("parameters") or {})
        for specs, target in (
            (document["inputs"], response.inputs),
            (document["outputs"], response.outputs),
        ):
            for spec in specs:
                tensor = target.add(
                    name=spec["name"], datatype=spec["datatype"], shape=spec["shape"]
                )
                set_parameters(tensor.parameters, spec.get("parameters") or {})
        return response

    async def model_statistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        document = self.plane.statistics(request.name or None, request.version or None)
        response = pb.ModelStatisticsResponse()
        json_format.ParseDict(document, response)
        return response

    async def model_config(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        document = model_config(
            self.plane.client, request.name, request.version or None, numbers_only=True
        )
        response = pb.ModelConfigResponse()
        json_format.ParseDict(document, response.config)
        return response

    async def repository_index(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for entry in self.plane.repository_index(request.ready):
            response.models.add(
                name=entry["name"],
                version=entry.get("version", ""),
                state=entry["state"],
                reason=entry["reason"],
            )
        return response

    async def repository_model_load(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        await self.plane.load(request.model_name, _authorization(context))
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        await self.plane.unload(request.model_name, _authorization(context))
        return pb.RepositoryModelUnloadResponse()


def trailing_metadata(headers: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """A runtime's response headers as gRPC metadata, keys lower-cased (as MLServer's
    ``to_metadata``); what gRPC cannot carry as text metadata (a key outside its alphabet,
    gRPC's own, a binary ``-bin`` key, a value that is not printable ASCII) is left out
    rather than fail the call."""
    pairs = []
    for name, value in headers.items():
        key = name.lower()
        if (
            _METADATA_KEY.fullmatch(key)
            and not key.startswith("grpc-")
            and not key.endswith("-bin")
            and key not in _CALL_HEADERS
            and _METADATA_VALUE.fullmatch(value)
        ):
            pairs.append((key, value))
    return tuple(pairs)


def ok_body(reply: Reply) -> bytes:
    """A ModelInfer reply's response bytes (a view of a large custom runtime's), or raises
    with the status it failed with."""
    if reply.status != 200:
        raise from_status(reply.status, reply.body.decode("utf-8", "replace"))
    return reply.body


def infer_request_id() -> str:
    """The request id a ModelInfer call ends with: resolved by ``infer``, or generated when
    it failed before resolving one (bad bytes, unknown model, an unusable id)."""
    request_id = current_request_id.get()
    if request_id is None:
        request_id = generate()
        settle_id(request_id)
    return request_id


def settle_id(request_id: str | None) -> None:
    """The one place a gRPC call's request id is set: in ``current_request_id``, which the
    log records and the trailing metadata read (None: not known yet)."""
    current_request_id.set(request_id)


def _call_metadata(source: Any) -> Iterable[tuple[Any, Any]]:
    """The call's key/value pairs: from grpc.aio's context, or the HTTP/2 layer's headers."""
    if source is None:
        return ()
    if hasattr(source, "invocation_metadata"):
        return source.invocation_metadata()  # type: ignore[no-any-return]
    return source  # type: ignore[no-any-return]


def _authorization(context: Any) -> str | None:
    """The admin token's carrier: ``authorization: Bearer TOKEN`` metadata."""
    return authorization_of(context.invocation_metadata() if context is not None else None)


def typed_methods(service: InferenceService) -> dict[str, tuple[Handler, Any]]:
    """Every RPC but ModelInfer: name → (handler(request, context), request message)."""
    return {
        "ServerLive": (service.server_live, pb.ServerLiveRequest),
        "ServerReady": (service.server_ready, pb.ServerReadyRequest),
        "ModelReady": (service.model_ready, pb.ModelReadyRequest),
        "ServerMetadata": (service.server_metadata, pb.ServerMetadataRequest),
        "ModelMetadata": (service.model_metadata, pb.ModelMetadataRequest),
        "ModelStatistics": (service.model_statistics, pb.ModelStatisticsRequest),
        "ModelConfig": (service.model_config, pb.ModelConfigRequest),
        "RepositoryIndex": (service.repository_index, pb.RepositoryIndexRequest),
        "RepositoryModelLoad": (service.repository_model_load, pb.RepositoryModelLoadRequest),
        "RepositoryModelUnload": (
            service.repository_model_unload,
            pb.RepositoryModelUnloadRequest,
        ),
        # Triton's trace and logging extensions (settings_rpc.py).
        "TraceSetting": (service.settings.trace_setting, pb.TraceSettingRequest),
        "LogSettings": (service.settings.log_settings, pb.LogSettingsRequest),
        # Triton's system shared-memory extension (shm_rpc.py).
        **service.shared_memory.methods(),
    }


def check_key(keys: ApiKeys, method: str, request: Any, metadata: Iterable[Any]) -> None:
    """Refuse a call without a key that may make it (Unauthorized: UNAUTHENTICATED,
    Forbidden: PERMISSION_DENIED); the health probes are open, load and unload answer to
    the admin token when one is set (``api_keys.py``). ``request``: the message or
    ModelInfer's bytes, for the model it names."""
    if method in OPEN_METHODS:
        return
    admin = method in ADMIN_METHODS
    if admin and keys.admin_token:
        return
    name = "-" if method in REGION_METHODS else route_of(request)[0]
    try:
        keys.check(metadata, None if name == "-" else name, admin)
    except RateLimited:
        count_rejected("grpc", KEY_RATE_LIMIT)
        raise


# -- what both servers report ------------------------------------------------------------
def model_of(request: Any) -> str:
    """The model a request names, for the access log."""
    return route_of(request)[0]


def route_of(request: Any) -> tuple[str, str | None]:
    """The model and version a request names, for the access log and spans."""
    if isinstance(request, bytes):
        try:
            return read_route(request)
        except InferpoolError:
            return "-", None
    for field in ("model_name", "name"):
        value = getattr(request, field, "")
        if value:
            version = getattr(request, "version", "") or getattr(request, "model_version", "")
            return str(value), version or None
    return "-", None


def call_status(exc: Exception, method: str) -> tuple[str, str, int]:
    """The status a call that raised ``exc`` ends with: (code name, message, pushback).

    ``pushback`` (milliseconds; 0: none) asks for gRPC's form of Retry-After
    (``grpc-retry-pushback-ms``), which clients with a retry policy honour. Anything but
    an InferpoolError is logged: a bug.
    """
    if isinstance(exc, InferpoolError):
        if isinstance(exc, Overloaded):
            count_rejected("grpc", OVERLOAD)
        pushback = exc.retry_seconds * 1000 if exc.retry_after else 0
        return exc.grpc_code, exc.message, pushback
    logger.exception("gRPC %s failed", method)
    return "INTERNAL", f"internal error: {type(exc).__name__}: {exc}", 0
