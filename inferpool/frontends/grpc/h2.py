"""gRPC over inferpool's own HTTP/2 (``inferpool.transport.http2``): the default.

It serves the same ``InferenceService`` as the grpc.aio implementation (``aio.py``):
ModelInfer's request stays raw bytes and goes to the engine, the other RPCs parse and
serialize the generated messages. What gRPC adds to HTTP/2 lives here and in
``h2_call.py``, the transport knowing none of it: the path names the method (the route
table, ``GrpcH2Server.methods``), ``content-type: application/grpc``, 5-byte
length-prefixed messages, ``grpc-timeout`` deadlines, and the status in trailers
(``grpc-status``, ``grpc-message``, ``grpc-retry-pushback-ms`` when overloaded, and
ModelInfer's ``x-request-id``: see ``request_context``). A client that resets its stream
or goes away cancels its call, and a call past its deadline is cancelled and answered
DEADLINE_EXCEEDED. grpc.health.v1.Health (``health.py``) is served beside it: Check as
one more typed RPC, Watch as the one server-streaming call (``_watch``: HEADERS,
a DATA frame per message, then the trailers); and server reflection (``reflection.py``),
bidirectional as ModelStreamInfer (``h2_stream.py``).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from inferpool.engine.client import EngineClient
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.grpc.compression import (
    response_gzip,
)
from inferpool.frontends.grpc.custom import ExtensionServices, extension_methods
from inferpool.frontends.grpc.early import call_admission, path_of
from inferpool.frontends.grpc.h2_call import (
    NOT_GRPC_HEADERS,
    OK_TRAILERS,
    REQUEST_ID,
    RESPONSE_HEADERS,
    CallError,
    Expiry,
    HeadersContext,
    answer_parts,
    call_end,
    framed,
    held_back,
    is_grpc,
    ok_trailers,
    parse_timeout,
    parsed,
    status_trailers,
    stream_status,
    too_large,
    unframe,
)
from inferpool.frontends.grpc.health import CHECK_PATH, WATCH_PATH, HealthService
from inferpool.frontends.grpc.model_repository import REPOSITORY_SERVICE, repository_methods
from inferpool.frontends.grpc.observer import CallObserver
from inferpool.frontends.grpc.service import (
    SERVICE,
    InferenceService,
    check_key,
    infer_request_id,
    ok_body,
    response_metadata,
    typed_methods,
)
from inferpool.frontends.listen import bind_socket
from inferpool.frontends.tls import alpn_of
from inferpool.protocol.health import HealthCheckRequest, MalformedMessage
from inferpool.protocol.priority import HEADER as PRIORITY_HEADER
from inferpool.settings import ServerSettings
from inferpool.transport.http2 import Http2Connection
from inferpool.transport.http2_streams import Stream
from inferpool.transport.http2_wire import Limits, literal

# The header (metadata) that asks for a priority level (``protocol/priority.py``).
PRIORITY = PRIORITY_HEADER.encode()

if TYPE_CHECKING:
    from inferpool.frontends.api_keys import ApiKeys
    from inferpool.observability.tracing import RequestTracer


def unary_methods(
    service: InferenceService, health: HealthService
) -> dict[bytes, tuple[str, Any, Any]]:
    """Each unary method's path: its name, its handler and its request message (None for
    ModelInfer, read from its bytes); the V2 service's, inferpool's own services' (custom
    endpoints, feedback), MLServer's model-repository service's and health's Check."""
    prefix = f"/{SERVICE}/".encode()
    methods: dict[bytes, tuple[str, Any, Any]] = {
        prefix + name.encode(): (name, handler, message)
        for name, (handler, message) in typed_methods(service).items()
    }
    methods[prefix + b"ModelInfer"] = ("ModelInfer", None, None)
    services = extension_methods(ExtensionServices(service.plane))
    services[REPOSITORY_SERVICE] = repository_methods(service)  # MLServer's older names
    for extension, calls in services.items():
        for name, (handler, message) in calls.items():
            methods[f"/{extension}/{name}".encode()] = (name, handler, message)
    methods[CHECK_PATH] = ("Check", health.check, HealthCheckRequest)
    return methods


class GrpcH2Server:
    """GRPCInferenceService on inferpool's HTTP/2 server, on the running loop."""

    def __init__(
        self,
        client: EngineClient,
        settings: ServerSettings,
        connections: Any = None,
        tracer: RequestTracer | None = None,
        tls: ssl.SSLContext | None = None,
        keys: ApiKeys | None = None,
    ) -> None:
        """``connections``: the server's ``frontends.connections.Connections`` (or None);
        ``tracer``: its ``tracing.RequestTracer``, or None (tracing off); ``tls``: the
        context of gRPC over TLS (ALPN h2 required), or None (h2c); ``keys``: the API
        keys calls must carry, or None."""
        self.settings = settings
        self.tls = tls
        self._protocol = Http2Connection if tls is None else _TlsConnection
        # Each call's access log line and ModelInfer's span (observer.py).
        self.observer = CallObserver(settings.access_log, tracer, keys)
        self.registry = connections
        self.max_message = settings.max_body_bytes
        # The HTTP/2 body of a unary call is the message and its 5-byte prefix.
        body_limit = {"max_body_bytes": settings.max_body_bytes + 5}
        self.limits = Limits.from_settings(settings.model_copy(update=body_limit))
        # Responses gzipped for clients that accept it (compression.py), or None.
        self.gzip = response_gzip(settings)
        self.keys = keys
        self.service = InferenceService(DataPlane(client), keys)
        # grpc.health.v1.Health: Check is one more typed RPC, Watch streams (_watch).
        self.health = HealthService(self.service.plane)
        self.methods = unary_methods(self.service, self.health)
        self.admission = call_admission(client, keys, self.observer.on)  # early.py
        # ModelStreamInfer (bidirectional) starts at its headers: h2_stream.py.
        self.stream_path = f"/{SERVICE}/ModelStreamInfer".encode()
        # Server reflection (bidirectional, as ModelStreamInfer): reflection.py.
        self.reflection: Any = None
        if settings.grpc_reflection:
            from inferpool.frontends.grpc.reflection import PATHS, ReflectionStream

            self.reflection = ReflectionStream()
            self.reflection_paths = PATHS
        self.open: set[Http2Connection] = set()
        self.calls: set[asyncio.Task[None]] = set()
        self._server: asyncio.AbstractServer | None = None
        # The serving loop (``start``): each call is a task of it, made by create_task
        # rather than ensure_future, which looks the loop up (and the pid) every time.
        self._loop: asyncio.AbstractEventLoop | None = None
        self.socket = bind_socket(settings.host, settings.grpc_port, "gRPC")

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        handshake = (self.settings.handshake_timeout or None) if self.tls is not None else None
        self._server = await loop.create_server(
            self._connection, sock=self.socket, ssl=self.tls, ssl_handshake_timeout=handshake
        )

    def _connection(self) -> Http2Connection:
        connection = self._protocol(
            self._on_request,
            self.open.discard,
            limits=self.limits,
            registry=self.registry,
            on_reject=self._reject,
            on_body_head=self._check_prefix,
            on_headers=self._on_headers,
        )
        connection.on_body_start = self.admission
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
        path = path_of(stream.headers)  # served methods go on at no more cost than this
        if path in self.methods or path == WATCH_PATH:
            return
        headers = dict(stream.headers)
        if not is_grpc(headers):
            return
        service: Any = self.service
        method = "ModelStreamInfer"
        if self.reflection is not None and path in self.reflection_paths:
            service, method = self.reflection, "ServerReflectionInfo"
        try:
            if path != self.stream_path and service is self.service:
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
        peer = _peer(connection) if self.observer.log else None
        serving = serve_stream(
            service, connection, stream, reader, expires, self.observer, peer, self.gzip, method
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
            priority = headers.get(PRIORITY)
            call = self._call(connection, stream, entry, message, expires, given, priority)
            self._start_call(stream, call)

    async def _call(
        self,
        connection: Http2Connection,
        stream: Stream,
        entry: tuple[str, Any, Any],
        message: bytes,
        expires: float | None,
        given: bytes | None = None,
        priority: bytes | None = None,
    ) -> None:
        """One call; ``given``: its ``x-request-id`` header, if any; ``priority``: its
        ``inferpool-priority`` header, if any."""
        name, handler, request_type = entry
        observer = self.observer
        started = time.perf_counter()
        start_ns = time.time_ns() if observer.tracer is not None else 0
        code, text, pushback, request = "OK", "", 0, message
        reply = None
        request_id = b""  # ModelInfer's, once it ends
        expiry = None if expires is None else Expiry(expires)
        try:
            keys = self.keys
            if handler is None:
                if keys is not None:
                    check_key(keys, name, message, stream.headers)
                text_id = None if given is None else given.decode("latin-1")
                infer = self.service.infer
                reply = await infer(message, expires, stream.headers, text_id, priority)
                body = ok_body(reply)
            else:
                request = parsed(name, request_type, message)
                if keys is not None:
                    check_key(keys, name, request, stream.headers)
                context = HeadersContext(stream.headers, expires)
                body = (await handler(request, context)).SerializeToString()
            if expires is not None and time.monotonic() >= expires:
                # The deadline passed while the loop was busy (an in-process model), so
                # the timer could not fire; the client has given up on this reply.
                raise CallError("DEADLINE_EXCEEDED", "Deadline Exceeded")
            request_id = self._answer(connection, stream, body, handler is None)
        except (Exception, asyncio.CancelledError) as exc:
            code, text, pushback = call_end(exc, stream, name, expiry)
            if code == "CANCELLED":
                raise
        finally:
            if expiry is not None:
                expiry.timer.cancel()
            if handler is None and not request_id:
                request_id = infer_request_id().encode()
            if observer.on:
                known = request_id.decode() if request_id else None
                peer = _peer(connection)
                observer.finished(
                    name, request, stream.headers, peer, code, text, reply, started, start_ns, known
                )
        if code != "OK":
            trailers = status_trailers(code, text, pushback)
            if request_id:
                trailers += literal(REQUEST_ID, request_id)
            connection.respond(stream, RESPONSE_HEADERS + trailers, b"", b"")

    def _answer(
        self, connection: Http2Connection, stream: Stream, body: bytes, infer: bool
    ) -> bytes:
        """Write a call's OK answer (gzipped if asked and worth it); ModelInfer's
        (``infer``) carries its request id and the runtime's headers in its trailers.
        Returns that request id (b"" for the other methods)."""
        held_back(connection, len(body))
        head, data, lead = answer_parts(self.gzip, stream.headers, body)
        if not infer:
            connection.respond(stream, head, data, OK_TRAILERS, lead)
            return b""
        request_id = infer_request_id().encode()
        trailers = ok_trailers(request_id)
        metadata = response_metadata.get()
        if metadata:  # a runtime's parameters.headers, as MLServer sends them
            trailers += b"".join(literal(k.encode(), v.encode()) for k, v in metadata)
        connection.respond(stream, head, data, trailers, lead)
        return request_id

    async def _watch(
        self, connection: Http2Connection, stream: Stream, message: bytes, expires: float | None
    ) -> None:
        """grpc.health.v1.Health/Watch, a server-streaming call: the status now and at each
        change (``HealthService``), until the client cancels, the deadline passes
        (DEADLINE_EXCEEDED) or the server stops (OK)."""
        started = time.perf_counter()
        code, text, pushback = "OK", "", 0
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
            if self.observer.log:
                peer = _peer(connection)
                self.observer.stream_finished("Watch", stream.headers, peer, code, started)
        trailers = status_trailers(code, text, pushback)
        if opened:
            connection.end_stream(stream, trailers)
        else:
            connection.respond(stream, RESPONSE_HEADERS + trailers, b"", b"")


class _TlsConnection(Http2Connection):
    """gRPC over TLS: a client must have agreed on ``h2`` by ALPN (the gRPC protocol asks
    for it); one that did not (an HTTPS client, a TLS probe) is closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if alpn_of(transport) != "h2":
            transport.abort()  # type: ignore[attr-defined]  # a stream server's transport
            return
        super().connection_made(transport)


def _peer(connection: Http2Connection) -> str | None:
    """``host:port`` of the connection's peer, for the access log and spans."""
    transport = connection.transport
    address = transport.get_extra_info("peername") if transport is not None else None
    return f"{address[0]}:{address[1]}" if address else None
