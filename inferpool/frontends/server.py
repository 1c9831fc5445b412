"""Runs the whole server on one uvloop loop: REST (Uvicorn or Hypercorn), gRPC and the engine.

Start-up order: bind and serve (so liveness answers at once), then the engine's one
start-up (``EngineClient.start``: workers, every model, then ready). Signal handlers only
record; this loop acts. The drain, on SIGTERM or SIGINT (to this process or to its whole
group: the workers and the template ignore both):

1. readiness turns false at once (REST, ServerReady, grpc.health.v1), liveness stays true;
2. the listeners keep accepting and the engine keeps serving for ``drain_delay`` seconds,
   while the orchestrator takes the endpoint out (a second signal ends the delay; none
   when the signal came before start-up ended: the server was never ready);
3. the listeners stop accepting and every frontend drains what it holds (HTTP/1.1
   answers with ``Connection: close``, HTTP/2 and gRPC send GOAWAY), each within
   ``shutdown_timeout``; the pool kills a worker still hung near that deadline;
4. the workers and the template stop, last, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import ssl
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from inferpool.engine.admin import SettingsError
from inferpool.engine.client import EngineClient, StartupFailed, make_client
from inferpool.errors import NotReady
from inferpool.frontends.allocator import keep_bodies_on_the_heap
from inferpool.frontends.api_keys import ApiKeys
from inferpool.frontends.connections import Connections, raise_fd_limit
from inferpool.frontends.file_poll import FilePoll, start_polling, stop_polling
from inferpool.frontends.grpc.aio import GrpcServer
from inferpool.frontends.grpc.h2 import GrpcH2Server
from inferpool.frontends.hypercorn_drain import DrainBodyFirst
from inferpool.frontends.listen import bind_socket
from inferpool.frontends.metrics import build_metrics_app
from inferpool.frontends.reclaim import trim_soon
from inferpool.frontends.rest.app import build_app, middleware
from inferpool.frontends.rest.early import Admission, header_admission
from inferpool.frontends.rest.http1 import protocol_class
from inferpool.frontends.tls import ALPN_GRPC, ALPN_HTTP1, ALPN_HTTP2, ServerTls
from inferpool.settings import ServerSettings
from inferpool.transport.unsent import ANSWERS

logger = logging.getLogger("inferpool")

INTERRUPTED = 128 + signal.SIGINT  # 130: the exit code of a start-up interrupted by Ctrl-C


class _Signals:
    """SIGTERM and SIGINT, counted: the first starts the drain, a second ends its delay."""

    def __init__(self) -> None:
        self.first = asyncio.Event()
        self.again = asyncio.Event()
        self.name = ""  # the first signal's
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._received, sig)

    def _received(self, sig: signal.Signals) -> None:
        if not self.first.is_set():
            self.name = sig.name
            self.first.set()
        elif not self.again.is_set():
            logger.info("%s again: the drain delay ends now", sig.name)
            self.again.set()


class _Uvicorn(uvicorn.Server):
    """Uvicorn without its own signal handling: the server's loop owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class RestServer:
    """An ASGI app on its own port: Uvicorn+httptools, or Hypercorn with ``--http2``.

    Uvicorn runs the guarded protocol (``rest/http1.py``: timeouts, header and body limits, the
    connection registry). Hypercorn gets the equivalents its config has (``_hypercorn``).
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: ServerSettings,
        port: int,
        http2: bool = False,
        connections: Connections | None = None,
        frontend: str = "rest",
        tls: ssl.SSLContext | None = None,
        admission: Admission | None = None,
    ) -> None:
        """``frontend``: what its connections are called in the metrics (rest, metrics);
        ``tls``: the context of HTTPS on this port, or None (plain HTTP); ``admission``:
        the HTTP/1.1 protocol's check of infer requests from their headers (``early.py``)."""
        self.admission = admission
        self.frontend = frontend
        self.tls = tls
        self.settings = settings
        self.app = app
        self.http2 = http2
        self.connections = connections or Connections(settings.max_connections)
        self.socket = bind_socket(settings.host, port)
        self._task: asyncio.Task[None] | None = None
        self._uvicorn: _Uvicorn | None = None
        self._hypercorn_stop = asyncio.Event()

    async def start(self) -> None:
        if self.http2:
            self._task = asyncio.create_task(self._serve_hypercorn())
            return
        config = uvicorn.Config(
            self.app,
            http=protocol_class(self.settings, self.connections, self.frontend, self.admission),
            loop="none",
            lifespan="off",
            # No WebSocket routes: nor the import of websockets (whose legacy module, which
            # older Uvicorns load, warns of its deprecation at import).
            ws="none",
            access_log=False,
            # No handler of its own: its lines go through the root logger, formatted as
            # every other line; its levels are inferpool.logs' (log_level, log_levels).
            log_config=None,
            log_level=None,
            # Annotated int, but only handed to asyncio.wait_for: a float is exact.
            timeout_graceful_shutdown=self.settings.shutdown_timeout,  # type: ignore[arg-type]
        )
        if self.tls is not None:
            config.load()
            config.ssl = self.tls  # ours, not one of its own: reloads reach it (tls.py)
        self._uvicorn = _Uvicorn(config)
        self._task = asyncio.create_task(self._uvicorn.serve(sockets=[self.socket]))
        while not self._uvicorn.started and not self._task.done():
            await asyncio.sleep(0.01)

    async def _serve_hypercorn(self) -> None:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        config = _hypercorn_config(Config(), self.settings)
        # Its logger without a handler of its own, as Uvicorn's (levels: inferpool.logs).
        config.errorlog = logging.getLogger("hypercorn.error")
        config.accesslog = None
        # Hypercorn binds by name; it re-creates the socket from the fd we already hold.
        config.bind = [f"fd://{self.socket.fileno()}"]
        if self.tls is not None:
            tls = self.tls
            # Its ssl_enabled is "both files named"; the context served is ours (tls.py).
            config.certfile = config.keyfile = "inferpool"
            config.create_ssl_context = lambda: tls
            config.ssl_handshake_timeout = self.settings.handshake_timeout or None
        app = DrainBodyFirst(self.app, self.settings.max_body_bytes)
        # Hypercorn's annotation wants its own scope TypedDicts; any ASGI app serves.
        await serve(app, config, shutdown_trigger=self._hypercorn_stop.wait)  # type: ignore[arg-type]

    async def stop(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        self._hypercorn_stop.set()
        if self._task is not None:
            await self._task


def _hypercorn_config(config: Any, settings: ServerSettings) -> Any:
    """Hypercorn's equivalents of the limits and timeouts.

    Hypercorn cannot do: a header timeout from the first byte (only ``read_timeout``, the
    longest silence between two reads, so one byte at a time keeps a request open), a body
    timeout, a write bound (a peer that reads nothing holds its answer), a handshake
    timeout apart from the idle one, a header count limit, and the shared connection
    registry (``max_connections``). Those are Uvicorn's (the default HTTP/1.1 server).
    """
    config.graceful_timeout = settings.shutdown_timeout
    # Hypercorn's idle timer runs from accept and between requests: handshake and idle.
    config.keep_alive_timeout = settings.idle_timeout
    # No read may wait longer than this; a request waits silently for its model, so the
    # bound must cover the longest a model may take, else a slow answer loses its client.
    # (A Request-Timeout header may ask for longer than --request-timeout: not bounded.)
    longest = (
        settings.header_timeout,
        settings.body_timeout,
        settings.idle_timeout,
        settings.model_timeout,
        settings.request_timeout,
    )
    config.read_timeout = int(max(longest)) + 1 if settings.model_timeout > 0 else None
    config.h11_max_incomplete_size = settings.max_header_bytes
    config.h2_max_header_list_size = settings.max_header_bytes
    config.h2_max_concurrent_streams = settings.max_concurrent_streams
    return config


async def serve(settings: ServerSettings) -> int:
    """Serve until SIGTERM/SIGINT; the process exit code."""
    keep_bodies_on_the_heap()  # glibc: no page faults per large request body
    # Answers clients have not read yet: bounded in total and per connection.
    ANSWERS.configure(
        settings.max_unsent_bytes, settings.max_unsent_bytes_per_connection, trim_soon
    )
    try:
        # Every frontend's connections under one cap, bounded by the descriptors we may open.
        connections = Connections(settings.max_connections, raise_fd_limit())
        client = make_client(settings)
        # None unless --tracing (and OpenTelemetry installed): then nothing per request.
        from inferpool.observability.tracing import configure as configure_tracing

        tracer = configure_tracing(settings)
        keys = ApiKeys.from_settings(settings)
        tls = ServerTls.from_settings(settings)
        servers = _servers(client, connections, tracer, tls, keys)
    except (OSError, SettingsError) as exc:  # SettingsError: e.g. an unreadable token file
        logger.critical("%s", exc)  # a log line, so that --log-format json says it as JSON
        return 1
    signals = _Signals()
    for server in servers:
        await server.start()
    scheme = "https" if tls else "http"
    logger.info("REST on %s://%s:%d", scheme, settings.host, settings.http_port)
    if settings.grpc_port > 0:
        over = " (TLS)" if tls else ""
        logger.info("gRPC%s on %s:%d", over, settings.host, settings.grpc_port)
    reloading = [
        start_polling(FilePoll(tls.paths), tls.reload, "the TLS certificate") if tls else None,
        start_polling(FilePoll([keys.path]), keys.reload, "the API key file") if keys else None,
    ]
    if settings.metrics_port > 0:
        logger.info("metrics on http://%s:%d/metrics", settings.host, settings.metrics_port)
    try:
        return await _start_then_wait(client, signals)
    finally:
        for task in reloading:
            await stop_polling(task)
        await _drain(client, servers, signals)
        if tracer is not None:
            tracer.shutdown()  # the spans still buffered are exported


def _servers(
    client: EngineClient,
    connections: Connections,
    tracer: Any,
    tls: ServerTls | None,
    keys: ApiKeys | None,
) -> list[RestServer | GrpcServer | GrpcH2Server]:
    """Every listener, bound: REST, gRPC and metrics, as the settings ask."""
    settings = client.settings
    # No port of its own: /metrics on the REST port, where KServe scrapes by default.
    metrics_here = build_metrics_app(client).routes if settings.metrics_port == 0 else []
    rest_app = build_app(client, tracer, metrics_here, keys)
    http_alpn = ALPN_HTTP2 if settings.http2 else ALPN_HTTP1
    admission = header_admission(client, bool(middleware(settings, tracer)), keys)
    servers: list[RestServer | GrpcServer | GrpcH2Server] = [
        RestServer(
            rest_app, settings, settings.http_port, settings.http2, connections,
            tls=tls.context(http_alpn) if tls else None, admission=admission,
        )
    ]  # fmt: skip
    if settings.grpc_port > 0:
        if settings.grpc_implementation == "builtin":
            grpc_tls = tls.context(ALPN_GRPC) if tls else None
            servers.append(GrpcH2Server(client, settings, connections, tracer, grpc_tls, keys))
        else:
            servers.append(GrpcServer(client, settings, tracer=tracer, tls=tls, keys=keys))
    if settings.metrics_port > 0:
        # Plain HTTP: an internal port for the scraper (docs/operate/security.md).
        metrics_app = build_metrics_app(client)
        servers.append(
            RestServer(metrics_app, settings, settings.metrics_port, False, connections, "metrics")
        )
    return servers


async def _drain(
    client: EngineClient, servers: list[RestServer | GrpcServer | GrpcH2Server], signals: _Signals
) -> None:
    """Not ready; accept for ``drain_delay``; stop accepting and drain; stop the workers."""
    client.begin_drain()
    # A server that never turned ready is in no endpoint list: nothing to wait for.
    delay = client.settings.drain_delay if client.started else 0.0
    if signals.first.is_set():
        accepting = f"; accepting for {delay:g}s more (drain_delay)" if delay > 0 else ""
        logger.info("%s: shutting down, not ready%s", signals.name, accepting)
    if delay > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(signals.again.wait(), delay)
    client.begin_shutdown()
    logger.info("no longer accepting; draining what is in flight")
    # Every frontend drains at once, each within the shutdown grace period; the workers
    # stop after them.
    await asyncio.gather(*(server.stop() for server in servers))
    await client.close()
    logger.info("stopped")


async def _start_then_wait(client: EngineClient, signals: _Signals) -> int:
    """Start the engine (workers, then every model) unless a signal comes first, then
    wait for one; the exit code."""
    starting = asyncio.ensure_future(client.start())
    stopping = asyncio.ensure_future(signals.first.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            await asyncio.wait({starting})
            # Ctrl-C before the server was ready: the interrupted start-up's exit code, as
            # a shell reports it; SIGTERM (an orchestrator's stop) is a clean stop.
            return INTERRUPTED if signals.name == "SIGINT" else 0
        try:
            statuses = starting.result()
        except FileNotFoundError as exc:
            logger.critical("%s", exc)
            return 1
        except StartupFailed as exc:
            for reason in exc.reasons:
                logger.critical("%s", reason)
            return 1
        except NotReady as exc:  # the workers never came up (an overloaded host): no traceback
            logger.critical("the server could not start: %s", exc)
            return 1
        not_ready = client.not_ready_reason()
        logger.info("started with %d model(s); %s", len(statuses), not_ready or "ready")
        if client.settings.workers > 0:
            # The start-up heap (libraries, routes, settings) never becomes garbage; out of
            # the collector's sight, a full collection walks only what requests left: its
            # pause, tens of milliseconds with everything in view, no longer lands on a
            # request's latency. Not with --workers 0: there the models live here, and one
            # unloaded later could not be collected.
            gc.freeze()
        await stopping
        return 0
    finally:
        stopping.cancel()
