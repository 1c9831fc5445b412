"""GRPCInferenceService on grpc.aio (``--grpc-implementation grpcio``).

The service's typed RPCs get grpc.aio's (de)serializers; ModelInfer a generic handler
with none, so its request and reply stay bytes. Errors become statuses in ``guarded``,
which also puts ModelInfer's request id in the trailing metadata (``request_context``)
and hands the finished call to the server's ``CallObserver`` (``observer.py``: access
log, span); the builtin HTTP/2 layer's limits and timeouts map to grpc.aio's options.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc

from inferpool.engine.client import EngineClient
from inferpool.errors import InferpoolError
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.grpc.aio_gzip import OFF, AioGzip, aio_gzip, gzip_options
from inferpool.frontends.grpc.custom import ExtensionServices, extension_methods
from inferpool.frontends.grpc.health import HEALTH_SERVICE, HealthService
from inferpool.frontends.grpc.model_repository import REPOSITORY_SERVICE, repository_methods
from inferpool.frontends.grpc.observer import CallObserver
from inferpool.frontends.grpc.service import (
    SERVICE,
    Handler,
    InferenceService,
    call_status,
    check_key,
    infer_request_id,
    ok_body,
    response_metadata,
    typed_methods,
)
from inferpool.frontends.reclaim import PeriodicTrim
from inferpool.frontends.request_context import HEADER
from inferpool.protocol.health import HealthCheckRequest
from inferpool.settings import ServerSettings

if TYPE_CHECKING:
    from inferpool.frontends.api_keys import ApiKeys
    from inferpool.frontends.tls import ServerTls
    from inferpool.observability.tracing import RequestTracer

# Triton's default: messages as large as gRPC allows, so big raw batches fit.
MAX_MESSAGE_BYTES = 2**31 - 1
TRIM_PERIOD = 10.0  # seconds between two malloc_trim(0) calls (reclaim.PeriodicTrim)


def guarded(
    method: str,
    handler: Handler,
    observer: CallObserver,
    gzip: AioGzip = OFF,
    keys: ApiKeys | None = None,
) -> Handler:
    """``handler`` with errors turned into gRPC statuses, reported to ``observer``, behind
    the API ``keys`` when given (``service.check_key``).

    ModelInfer's handler returns the engine's ``Reply``: its bytes are the response, its
    request id goes into the trailing metadata, and the call is traced."""
    infer = method == "ModelInfer"
    traced = infer and observer.tracer is not None  # only ModelInfer is traced
    watched = observer.log or traced

    async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        start_ns = time.time_ns() if traced else 0
        # Read now: the context of a call that ends cancelled may no longer answer.
        peer, metadata = _call_of(context) if watched else (None, ())
        code = grpc.StatusCode.OK
        text = ""
        reply = None
        try:
            if keys is not None:
                check_key(keys, method, request, context.invocation_metadata() or ())
            if not infer:
                response = await handler(request, context)
                gzip.small_message(context, response)
                return response
            reply = await handler(request, context)
            body = ok_body(reply)
            if not isinstance(body, bytes):  # a view of a large custom answer (unwrap)
                body = bytes(body)  # grpcio sends bytes only
            context.set_trailing_metadata(((HEADER, infer_request_id()), *response_metadata.get()))
            gzip.small(context, len(body))
            return body
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED  # the client went away or its deadline passed
            raise
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            name, text, pushback = call_status(exc, method)
            code = grpc.StatusCode[name]
            trailing: tuple[tuple[str, str], ...] = ((HEADER, infer_request_id()),) if infer else ()
            if pushback:
                trailing += (("grpc-retry-pushback-ms", str(pushback)),)
            if trailing:
                context.set_trailing_metadata(trailing)
            await context.abort(code, text)
        finally:
            if watched:
                known = infer_request_id() if infer else None
                call = (method, request, metadata, peer)
                observer.finished(*call, code.name, text, reply, started, start_ns, known)

    return run


def _call_of(context: grpc.aio.ServicerContext) -> tuple[str | None, Any]:
    """The call's peer, ``host:port`` (grpc's ``ipv4:host:port`` without its scheme), and
    its metadata."""
    metadata = context.invocation_metadata() or ()
    peer: str = context.peer()
    if not peer:
        return None, metadata
    scheme, _, address = peer.partition(":")
    return (address if scheme in ("ipv4", "ipv6") else peer), metadata


def build_handler(
    client: EngineClient, observer: CallObserver, gzip: AioGzip = OFF, keys: ApiKeys | None = None
) -> grpc.GenericRpcHandler:
    """The generic handler serving GRPCInferenceService for one engine client; ``gzip``:
    the server's response compression (``aio_gzip.OFF``: off); ``keys``: the API keys
    calls must carry, or None."""
    service = InferenceService(DataPlane(client), keys)
    methods = {
        name: grpc.unary_unary_rpc_method_handler(
            guarded(name, handler, observer, gzip, keys),
            request_deserializer=message.FromString,
            response_serializer=_serialize,
        )
        for name, (handler, message) in typed_methods(service).items()
    }
    # No (de)serializers: the request and the reply stay bytes.
    methods["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        guarded("ModelInfer", service.model_infer, observer, gzip, keys)
    )
    methods["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        stream_infer(service, observer, gzip)
    )
    return grpc.method_handlers_generic_handler(SERVICE, methods)


def build_extension_handlers(
    client: EngineClient, observer: CallObserver, gzip: AioGzip = OFF, keys: ApiKeys | None = None
) -> list[grpc.GenericRpcHandler]:
    """The generic handlers serving inferpool's own services (``grpc/custom.py``) and
    MLServer's model-repository service (``grpc/model_repository.py``)."""
    plane = DataPlane(client)
    services = extension_methods(ExtensionServices(plane))
    services[REPOSITORY_SERVICE] = repository_methods(InferenceService(plane, keys))
    return [
        grpc.method_handlers_generic_handler(
            service,
            {
                name: grpc.unary_unary_rpc_method_handler(
                    guarded(name, handler, observer, gzip, keys),
                    request_deserializer=message.FromString,
                    response_serializer=_serialize,
                )
                for name, (handler, message) in methods.items()
            },
        )
        for service, methods in services.items()
    ]


def stream_infer(
    service: InferenceService, observer: CallObserver, gzip: AioGzip = OFF
) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext], AsyncIterator[bytes]]:
    """ModelStreamInfer on grpc.aio: ``InferenceService.stream_infer`` over the call's
    request iterator, each message written as it comes (grpc.aio waits for the client's
    window before taking the next: the back-pressure)."""

    async def call(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        started = time.perf_counter()
        peer, metadata = _call_of(context) if observer.log else (None, ())
        remaining = context.time_remaining()
        deadline = time.monotonic() + remaining if remaining is not None else None
        code = grpc.StatusCode.OK
        try:
            metadata_pairs = context.invocation_metadata() or ()
            async for message in service.stream_infer(requests, deadline, metadata_pairs):
                gzip.small(context, len(message))
                yield message
        except (asyncio.CancelledError, GeneratorExit):
            code = grpc.StatusCode.CANCELLED  # the client went away or its deadline passed
            raise
        except InferpoolError as exc:  # MLServer's message: an error ends the call
            name, text, _ = call_status(exc, "ModelStreamInfer")
            code = grpc.StatusCode[name]
            await context.abort(code, text)
        finally:
            if observer.log:
                observer.stream_finished("ModelStreamInfer", metadata, peer, code.name, started)

    return call


def build_health_handler(
    health: HealthService, observer: CallObserver, gzip: AioGzip = OFF
) -> grpc.GenericRpcHandler:
    """The generic handler serving grpc.health.v1.Health (Check, Watch)."""
    check = grpc.unary_unary_rpc_method_handler(
        guarded("Check", health.check, observer, gzip),
        request_deserializer=HealthCheckRequest.FromString,
        response_serializer=_serialize,
    )
    # Watch yields encoded responses: no serializer.
    watch = grpc.unary_stream_rpc_method_handler(
        health_watch(health, observer, gzip), request_deserializer=HealthCheckRequest.FromString
    )
    return grpc.method_handlers_generic_handler(HEALTH_SERVICE, {"Check": check, "Watch": watch})


def health_watch(
    health: HealthService, observer: CallObserver, gzip: AioGzip = OFF
) -> Callable[[HealthCheckRequest, grpc.aio.ServicerContext], AsyncIterator[bytes]]:
    """Watch on grpc.aio: a generator that writes one message at a time, and is offered
    the newest status only once its last one is written (``HealthService``)."""

    async def watch(
        request: HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        started = time.perf_counter()
        # Read now: the context of a call that ends cancelled may no longer answer.
        peer, metadata = _call_of(context) if observer.log else (None, ())
        code = grpc.StatusCode.OK
        loop = asyncio.get_running_loop()
        waiting: asyncio.Future[bytes] = loop.create_future()

        def send(data: bytes) -> bool:
            if waiting.done():
                return False  # one message is queued already: offered again next round
            waiting.set_result(data)
            return True

        try:
            try:
                watcher = health.watch(request.service, send)
            except InferpoolError as exc:
                name, message, _ = call_status(exc, "Watch")
                code = grpc.StatusCode[name]
                await context.abort(code, message)
            try:
                while True:
                    if not waiting.done():
                        await asyncio.wait(
                            (waiting, watcher.ended), return_when=asyncio.FIRST_COMPLETED
                        )
                    if not waiting.done():
                        return  # the server stops: the call ends with OK
                    data = waiting.result()
                    waiting = loop.create_future()
                    gzip.small(context, len(data))
                    yield data
            finally:
                health.unwatch(watcher)
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away or its deadline passed; grpc.aio closes a generator
            # whose last message could not be written (GeneratorExit) instead of
            # cancelling it.
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            if observer.log:
                observer.stream_finished("Watch", metadata, peer, code.name, started)

    return watch


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


class GrpcServer:
    """grpc.aio on the server's loop; stopping lets in-flight calls finish first."""

    def __init__(
        self,
        client: EngineClient,
        settings: ServerSettings,
        connections: Any = None,
        tracer: RequestTracer | None = None,
        tls: ServerTls | None = None,
        keys: ApiKeys | None = None,
    ) -> None:
        # ``connections`` (the shared registry) cannot see grpc.aio's connections: C-core
        # accepts them itself. Its own options bound them instead (grpc_options).
        # ``tracer``: the server's ``tracing.RequestTracer``, or None (tracing off).
        # ``tls``: the server's TLS files (C-core fetches each reload's), or None.
        self.settings = settings
        self.server = grpc.aio.server(options=grpc_options(settings) + gzip_options(settings))
        # The answers C-core held for slow readers are freed in its threads' arenas; the
        # frontend cannot see when (frontends/reclaim.py).
        self.trim = PeriodicTrim(TRIM_PERIOD)
        self.health = HealthService(DataPlane(client))
        # Each call's access log line and ModelInfer's span (observer.py).
        observer = CallObserver(settings.access_log, tracer, keys)
        # Compressing answers: each message under the threshold is sent uncompressed.
        gzip = aio_gzip(settings)
        self.server.add_generic_rpc_handlers(
            (
                build_handler(client, observer, gzip, keys),
                build_health_handler(self.health, observer, gzip),
                *build_extension_handlers(client, observer, gzip, keys),
            )
        )
        if settings.grpc_reflection:  # grpcio-reflection's servicer: reflection.py
            from inferpool.frontends.grpc.reflection import aio_handlers

            self.server.add_generic_rpc_handlers(aio_handlers())
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        address = f"{host}:{settings.grpc_port}"
        try:
            if tls is None:
                bound = self.server.add_insecure_port(address)
            else:
                bound = self.server.add_secure_port(address, tls.grpc_credentials())
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise OSError(f"cannot listen on {address} for gRPC")

    async def start(self) -> None:
        await self.server.start()
        self.trim.start()

    async def stop(self) -> None:
        """Refuse new calls; in-flight calls get the shutdown grace period to finish."""
        self.trim.cancel()
        self.health.close()  # the open Watches end (OK) instead of holding the drain up
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
