"""gRPC over inferpool's own HTTP/2 (``inferpool.transport.http2``): the default.

It serves the same ``InferenceService`` as the grpc.aio implementation (``aio.py``):
ModelInfer's request stays raw bytes and goes to the engine, the other RPCs parse and
serialize the generated messages. What gRPC adds to HTTP/2 lives here, the transport
knowing none of it: the path names the method (the route table, ``GrpcH2Server.methods``),
``content-type: application/grpc``, 5-byte length-prefixed messages, ``grpc-timeout``
deadlines, and the status in trailers (``grpc-status``, ``grpc-message``,
``grpc-retry-pushback-ms`` when overloaded, and ModelInfer's ``x-request-id``: see
``request_context``). A client that resets
its stream or goes away cancels its call, and a call past its deadline is cancelled and
answered DEADLINE_EXCEEDED. grpc.health.v1.Health (``health.py``) is served beside it:
Check as one more typed RPC, Watch as the one server-streaming call (``_watch``: HEADERS,
a DATA frame per message, then the trailers).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from inferpool.engine.client import EngineClient
from inferpool.frontends.access_log import given_id, log_request
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.grpc.compression import (
    GZIP_HEADERS,
    BadMessage,
    inflate,
    response_gzip,
)
from inferpool.frontends.grpc.custom import ExtensionServices, extension_methods, log_method
from inferpool.frontends.grpc.health import CHECK_PATH, WATCH_PATH, HealthService
from inferpool.frontends.grpc.service import (
    RETRY_AFTER_MS,
    SERVICE,
    InferenceService,
    call_status,
    infer_request_id,
    ok_body,
    response_metadata,
    route_of,
    trace_call,
    typed_methods,
)
from inferpool.frontends.listen import bind_socket
from inferpool.frontends.request_context import HEADER
from inferpool.protocol.health import HealthCheckRequest, MalformedMessage
from inferpool.settings import ServerSettings
from inferpool.transport.http2 import Http2Connection
from inferpool.transport.http2_streams import REFUSED, Stream
from inferpool.transport.http2_wire import Limits, literal, literal_indexed_name
from inferpool.transport.unsent import ANSWERS, SMALL

if TYPE_CHECKING:
    from inferpool.observability.tracing import RequestTracer

# gRPC status codes (grpc/doc/statuscodes.md).
STATUS = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}  # fmt: skip

# Response headers: ":status: 200" is static-table entry 8, "content-type" entry 31.
GRPC_CONTENT_TYPE = b"application/grpc"
RESPONSE_HEADERS = b"\x88" + literal_indexed_name(31, GRPC_CONTENT_TYPE)
OK_TRAILERS = literal(b"grpc-status", b"0")
REQUEST_ID = HEADER.encode()
# OK_TRAILERS and the x-request-id literal's name: only the value's length and bytes follow.
_OK_AND_ID = OK_TRAILERS + literal(REQUEST_ID, b"")[:-1]
NOT_GRPC_HEADERS = literal_indexed_name(8, b"415")  # ":status: 415"
# grpc-timeout units (PROTOCOL-HTTP2.md) in seconds.
_TIMEOUT_UNITS = {
    ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0,
    ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9,
}  # fmt: skip
# A longer grpc-timeout (grpc-go sends up to 2562047H, ~292 years) means "no deadline" in
# practice; clamped, so that the deadline always fits the worker slot header.
MAX_TIMEOUT = 365 * 24 * 3600.0
# Largest message when no limit is given (gRPC's own ceiling).
MESSAGE_CEILING = 2**31 - 1


class CallError(Exception):
    """A call that ends with a non-OK status before reaching the service."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status_trailers(code: str, message: str = "", pushback: bool = False) -> bytes:
    """Trailers carrying a status; the message percent-encoded as gRPC requires."""
    block = literal(b"grpc-status", str(STATUS[code]).encode())
    if message:
        encoded = quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode()
        block += literal(b"grpc-message", encoded)
    if pushback:
        block += literal(b"grpc-retry-pushback-ms", RETRY_AFTER_MS.encode())
    return block


def parse_timeout(value: bytes) -> float:
    """A ``grpc-timeout`` value (up to 8 digits and a unit) in seconds, at most a year."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        raise CallError("INTERNAL", f"malformed grpc-timeout {value.decode(errors='replace')!r}")
    unit = _TIMEOUT_UNITS.get(value[-1])
    if unit is None:
        raise CallError("INTERNAL", f"malformed grpc-timeout {value.decode(errors='replace')!r}")
    return min(int(value[:-1]) * unit, MAX_TIMEOUT)


def too_large(length: int, limit: int) -> str:
    return f"message of {length} bytes is over the limit of {limit} bytes (max_body_bytes)"


def unframe(
    chunks: list[bytes], limit: int = MESSAGE_CEILING, encoding: bytes | None = None
) -> bytes:
    """The one message of a unary call from its length-prefixed DATA, inflated by the
    call's ``grpc-encoding`` when flagged compressed (``compression.inflate``)."""
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if len(body) < 5:
        raise CallError("INTERNAL", "a unary call needs exactly one request message")
    flag = body[0]
    if flag > 1:
        raise CallError("INTERNAL", f"invalid compressed flag {flag} of the message prefix")
    length = int.from_bytes(body[1:5], "big")
    if length > limit:
        raise CallError("RESOURCE_EXHAUSTED", too_large(length, limit))
    if len(body) != 5 + length:
        raise CallError("INTERNAL", "a unary call needs exactly one request message")
    if flag == 0:
        return body[5:]
    try:
        return inflate(body[5:], encoding, limit)
    except BadMessage as exc:
        raise CallError(exc.code, exc.message) from None


def ok_trailers(request_id: bytes) -> bytes:
    """OK trailers with the call's ``x-request-id``."""
    if len(request_id) < 0x7F:  # its length fits the literal's one-byte form
        return _OK_AND_ID + bytes((len(request_id),)) + request_id
    return OK_TRAILERS + literal(REQUEST_ID, request_id)


def is_grpc(headers: dict[bytes, bytes]) -> bool:
    """A gRPC request: POST, ``content-type: application/grpc`` (or ``+proto`` ...)."""
    content_type = headers.get(b"content-type", b"")
    subtype = content_type[len(GRPC_CONTENT_TYPE) : len(GRPC_CONTENT_TYPE) + 1]
    return (
        headers.get(b":method") == b"POST"
        and content_type.startswith(GRPC_CONTENT_TYPE)
        and subtype in (b"", b"+", b";")  # application/grpc-web is not gRPC
    )


def framed(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


class HeadersContext:
    """The part of grpc.aio's ServicerContext that typed handlers use, over a call's
    HTTP/2 headers and deadline (the builtin implementation): ``invocation_metadata()``,
    ``time_remaining()``."""

    __slots__ = ("_expires", "_headers")

    def __init__(self, headers: list[tuple[bytes, bytes]], expires: float | None = None) -> None:
        self._headers = headers
        self._expires = expires

    def time_remaining(self) -> float | None:
        """Seconds until the call's deadline (``time.monotonic()``'s), None without one."""
        return None if self._expires is None else max(0.0, self._expires - time.monotonic())

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """Every header but the pseudo-headers, as (key, value) strings."""
        return tuple(
            (key.decode("latin-1"), value.decode("latin-1"))
            for key, value in self._headers
            if not key.startswith(b":")
        )


class GrpcH2Server:
    """GRPCInferenceService on inferpool's HTTP/2 server, on the running loop."""

    def __init__(
        self,
        client: EngineClient,
        settings: ServerSettings,
        connections: Any = None,
        tracer: RequestTracer | None = None,
    ) -> None:
        """``connections``: the server's ``frontends.connections.Connections`` (or None);
        ``tracer``: its ``tracing.RequestTracer``, or None (tracing off)."""
        self.settings = settings
        self.tracer = tracer
        self.registry = connections
        self.max_message = settings.max_body_bytes
        # The HTTP/2 body of a unary call is the message and its 5-byte prefix.
        body_limit = {"max_body_bytes": settings.max_body_bytes + 5}
        self.limits = Limits.from_settings(settings.model_copy(update=body_limit))
        self.access_log = settings.access_log
        # Responses gzipped for clients that accept it (compression.py), or None.
        self.gzip = response_gzip(settings)
        self.service = InferenceService(DataPlane(client))
        prefix = f"/{SERVICE}/".encode()
        self.methods: dict[bytes, tuple[str, Any, Any]] = {
            prefix + name.encode(): (name, handler, message)
            for name, (handler, message) in typed_methods(self.service).items()
        }
        self.methods[prefix + b"ModelInfer"] = ("ModelInfer", None, None)
        # inferpool's own services: custom endpoints and feedback.
        extension = extension_methods(ExtensionServices(self.service.plane))
        for service, methods in extension.items():
            for name, (handler, message) in methods.items():
                self.methods[f"/{service}/{name}".encode()] = (name, handler, message)
        # ModelStreamInfer (bidirectional) starts at its headers: h2_stream.py.
        self.stream_path = prefix + b"ModelStreamInfer"
        # grpc.health.v1.Health: Check is one more typed RPC, Watch streams (_watch).
        self.health = HealthService(self.service.plane)
        self.methods[CHECK_PATH] = ("Check", self.health.check, HealthCheckRequest)
        self.open: set[Http2Connection] = set()
        self.calls: set[asyncio.Task[None]] = set()
        self._server: asyncio.AbstractServer | None = None
        # The serving loop (``start``): each call is a task of it, made by create_task
        # rather than ensure_future, which looks the loop up (and the pid) every time.
        self._loop: asyncio.AbstractEventLoop | None = None
        self.socket = bind_socket(settings.host, settings.grpc_port, "gRPC")

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, sock=self.socket)

    def _connection(self) -> Http2Connection:
        connection = Http2Connection(
            self._on_request,
            self.open.discard,
            limits=self.limits,
            registry=self.registry,
            on_reject=self._reject,
            on_body_head=self._check_prefix,
            on_headers=self._on_headers,
        )
        self.open.add(connection)
        return connection

    def _check_prefix(self, head: bytes) -> str | None:
        """Refuse a message from its 5-byte prefix, before its bytes are buffered."""
        length = int.from_bytes(head[1:5], "big")
        return too_large(length, self.max_message) if length > self.max_message else None

    def _reject(self, connection: Http2Connection, stream: Stream, message: str) -> None:
        """A call over a limit of the HTTP/2 layer: RESOURCE_EXHAUSTED naming it."""
        trailers = status_trailers("RESOURCE_EXHAUSTED", message)
        connection.respond(stream, RESPONSE_HEADERS + trailers, b"", b"")

    async def stop(self) -> None:
        """Refuse new calls; in-flight calls get the shutdown grace period to finish."""
        if self._server is not None:
            self._server.close()
        self.health.close()  # the open Watches end (OK) instead of holding the drain up
        for connection in list(self.open):
            connection.goaway()
        if self.calls:
            await asyncio.wait(set(self.calls), timeout=self.settings.shutdown_timeout)
        for call in list(self.calls):
            call.cancel()
        # Answered connections close once their replies are written; give them a moment.
        closing = [connection.closed for connection in self.open]
        if closing:
            await asyncio.wait(closing, timeout=1)
        for connection in list(self.open):
            connection.abort()

    # -- one call --------------------------------------------------------------------------
    def _on_headers(self, connection: Http2Connection, stream: Stream) -> None:
        """A call's headers, before its body: a method not served is answered at once (a
        client that streams would otherwise wait for its deadline), ModelStreamInfer
        starts; any other call is served whole at its end (``_on_request``)."""
        path = _path_of(stream.headers)  # served methods go on at no more cost than this
        if path in self.methods or path == WATCH_PATH:
            return
        headers = dict(stream.headers)
        if not is_grpc(headers):
            return
        try:
            if path != self.stream_path:
                raise CallError("UNIMPLEMENTED", f"unknown method {path.decode(errors='replace')}")
            timeout = headers.get(b"grpc-timeout")
            expires = time.monotonic() + parse_timeout(timeout) if timeout is not None else None
        except CallError as exc:
            trailers = status_trailers(exc.code, exc.message)
            connection.respond(stream, RESPONSE_HEADERS + trailers, b"", b"")
            return
        from inferpool.frontends.grpc.h2_stream import MessageReader, serve_stream

        reader = MessageReader(self.max_message, headers.get(b"grpc-encoding"))
        stream.on_data = reader.feed
        peer = _peer(connection)
        serving = serve_stream(
            self.service, connection, stream, reader, expires, self.access_log, peer, self.gzip
        )
        self._start_call(stream, serving)

    def _start_call(self, stream: Stream, call: Coroutine[Any, Any, None]) -> None:
        """Run a stream's call as a task of the serving loop, which stop() waits for."""
        assert self._loop is not None  # set by start(), before any connection is made
        task = stream.task = self._loop.create_task(call)
        self.calls.add(task)
        task.add_done_callback(self.calls.discard)

    def _on_request(self, connection: Http2Connection, stream: Stream) -> None:
        headers = dict(stream.headers)
        path = headers.get(b":path", b"")
        if not is_grpc(headers):
            connection.respond(stream, NOT_GRPC_HEADERS, b"", b"")
            return
        entry = self.methods.get(path)
        try:
            if entry is None and path != WATCH_PATH:
                method = path.decode(errors="replace")
                raise CallError("UNIMPLEMENTED", f"unknown method {method}")
            timeout = headers.get(b"grpc-timeout")
            # The deadline counts from arrival, however long the call waits to start.
            expires = time.monotonic() + parse_timeout(timeout) if timeout is not None else None
            message = unframe(stream.body, self.max_message, headers.get(b"grpc-encoding"))
        except CallError as exc:
            trailers = status_trailers(exc.code, exc.message)
            connection.respond(stream, RESPONSE_HEADERS + trailers, b"", b"")
            return
        stream.body = []
        if entry is None:  # grpc.health.v1.Health/Watch
            self._start_call(stream, self._watch(connection, stream, message, expires))
        else:
            given = headers.get(REQUEST_ID)
            self._start_call(stream, self._call(connection, stream, entry, message, expires, given))

    async def _call(
        self,
        connection: Http2Connection,
        stream: Stream,
        entry: tuple[str, Any, Any],
        message: bytes,
        expires: float | None,
        given: bytes | None = None,
    ) -> None:
        """One call; ``given``: its ``x-request-id`` header, if any."""
        name, handler, request_type = entry
        started = time.perf_counter()
        start_ns = time.time_ns() if self.tracer is not None else 0
        code, text, pushback, request = "OK", "", False, message
        reply = None
        request_id = b""  # ModelInfer's, once it ends
        expired = False
        timer = None
        if expires is not None:
            task = asyncio.current_task()
            assert task is not None  # a coroutine run as a task (_on_request)

            def expire() -> None:
                # Remembered, not read off the clock later: the loop's timers may fire a
                # fraction of a millisecond before time.monotonic() reaches ``expires``.
                nonlocal expired
                expired = True
                task.cancel()

            timer = asyncio.get_running_loop().call_later(expires - time.monotonic(), expire)
        try:
            if handler is None:
                text_id = None if given is None else given.decode("latin-1")
                reply = await self.service.infer(message, expires, stream.headers, text_id)
                body = ok_body(reply)
            else:
                try:
                    request = request_type.FromString(message)
                except Exception:
                    raise CallError("INTERNAL", f"cannot parse the {name} request") from None
                context = HeadersContext(stream.headers, expires)
                body = (await handler(request, context)).SerializeToString()
            if expires is not None and time.monotonic() >= expires:
                # The deadline passed while the loop was busy (an in-process model), so
                # the timer could not fire; the client has given up on this reply.
                raise CallError("DEADLINE_EXCEEDED", "Deadline Exceeded")
            held_back(connection, len(body))
            head, data = RESPONSE_HEADERS, None
            gzip = self.gzip
            if gzip is not None and len(body) >= gzip.min_bytes:
                data = gzip.framed(stream.headers, body)
                head = RESPONSE_HEADERS if data is None else RESPONSE_HEADERS + GZIP_HEADERS
            if data is None:
                data = framed(body)
            if handler is None:
                request_id = infer_request_id().encode()
                trailers = ok_trailers(request_id)
                metadata = response_metadata.get()
                if metadata:  # a runtime's parameters.headers, as MLServer sends them
                    trailers += b"".join(literal(k.encode(), v.encode()) for k, v in metadata)
                connection.respond(stream, head, data, trailers)
            else:
                connection.respond(stream, head, data, OK_TRAILERS)
        except asyncio.CancelledError:
            if stream.closed:  # the client reset the stream or went away
                code = "CANCELLED"
                raise
            if expired or (expires is not None and time.monotonic() >= expires):
                code, text = "DEADLINE_EXCEEDED", "Deadline Exceeded"
            else:  # shutdown: its grace period ended before the call did
                code, text = "UNAVAILABLE", "the server is shutting down; retry the call"
        except CallError as exc:
            code, text = exc.code, exc.message
        except Exception as exc:
            code, text, pushback = call_status(exc, name)
        finally:
            if timer is not None:
                timer.cancel()
            if handler is None and not request_id:
                request_id = infer_request_id().encode()
            if self.access_log:
                rows = reply.rows if reply is not None else 0
                known = request_id.decode() if request_id else given_id(stream.headers)
                model, version = route_of(request)
                peer = _peer(connection)
                method = log_method(name, request)
                log_request("gRPC", method, peer, model, version, code, rows, started, known)
            if self.tracer is not None and handler is None:
                trace_call(
                    self.tracer,
                    name,
                    message,
                    stream.headers,
                    code,
                    text,
                    reply,
                    start_ns,
                    request_id.decode(),
                    _peer(connection),
                )
        if code != "OK":
            trailers = status_trailers(code, text, pushback)
            if request_id:
                trailers += literal(REQUEST_ID, request_id)
            connection.respond(stream, RESPONSE_HEADERS + trailers, b"", b"")

    async def _watch(
        self, connection: Http2Connection, stream: Stream, message: bytes, expires: float | None
    ) -> None:
        """grpc.health.v1.Health/Watch, a server-streaming call: the status now and at each
        change (``HealthService``), until the client cancels, the deadline passes
        (DEADLINE_EXCEEDED) or the server stops (OK)."""
        started = time.perf_counter()
        code, text, pushback = "OK", "", False
        opened = False

        def send(data: bytes) -> bool:
            nonlocal opened
            if stream.pending is not None:
                return False  # the last message waits for window: send the newest later
            if not opened:
                connection.open_stream(stream, RESPONSE_HEADERS)
                opened = True
            connection.send_data(stream, framed(data))
            return True

        try:
            try:
                request = HealthCheckRequest.FromString(message)
            except MalformedMessage:
                raise CallError("INTERNAL", "cannot parse the Watch request") from None
            watcher = self.health.watch(request.service, send)
            try:
                remaining = None if expires is None else max(0.0, expires - time.monotonic())
                async with asyncio.timeout(remaining):
                    await watcher.ended
            finally:
                self.health.unwatch(watcher)
        except (Exception, asyncio.CancelledError) as exc:
            code, text, pushback = stream_status(exc, stream, "Watch")
            if code == "CANCELLED":
                raise
        finally:
            if self.access_log:
                peer = _peer(connection)
                known = given_id(stream.headers)
                log_request("gRPC", "Watch", peer, "-", None, code, 0, started, known)
        trailers = status_trailers(code, text, pushback)
        if opened:
            connection.end_stream(stream, trailers)
        else:
            connection.respond(stream, RESPONSE_HEADERS + trailers, b"", b"")


def held_back(connection: Http2Connection, size: int) -> None:
    """Raise RESOURCE_EXHAUSTED instead of keeping an answer of ``size`` bytes past a bound
    of the answers peers have not read yet (``transport/unsent.py``)."""
    if size >= SMALL:
        refusal = ANSWERS.refusal(connection, size)
        if refusal is not None:
            REFUSED[refusal[0]] += 1
            raise CallError("RESOURCE_EXHAUSTED", refusal[1])


def stream_status(exc: BaseException, stream: Stream, method: str) -> tuple[str, str, bool]:
    """The status a streaming call (Watch, ModelStreamInfer) ends with when ``exc`` ended
    it: (code name, message, pushback). CANCELLED (the client went away): the caller
    re-raises the cancellation."""
    if isinstance(exc, TimeoutError):
        return "DEADLINE_EXCEEDED", "Deadline Exceeded", False
    if isinstance(exc, asyncio.CancelledError):
        if stream.closed:  # the client cancelled the call or went away
            return "CANCELLED", "", False
        return "UNAVAILABLE", "the server is shutting down; retry the call", False
    if isinstance(exc, CallError):
        return exc.code, exc.message, False
    assert isinstance(exc, Exception)
    return call_status(exc, method)


def _path_of(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A request's ``:path`` (a pseudo-header: among the first few)."""
    for name, value in headers:
        if name == b":path":
            return value
    return b""


def _peer(connection: Http2Connection) -> str | None:
    """``host:port`` of the connection's peer, for the access log and spans."""
    transport = connection.transport
    address = transport.get_extra_info("peername") if transport is not None else None
    return f"{address[0]}:{address[1]}" if address else None
