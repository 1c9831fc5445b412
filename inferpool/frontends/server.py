"""Runs the whole server on one uvloop loop: REST (Uvicorn or Hypercorn), gRPC and the engine.

Start-up order: bind and serve (so liveness answers at once), then the engine's one
start-up (``EngineClient.start``: workers, every model, then ready). Signal handlers only
record; this loop acts: ready turns false, servers stop accepting and drain in-flight
requests, the engine closes, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from inferpool.engine.admin import SettingsError
from inferpool.engine.client import EngineClient, StartupFailed, make_client
from inferpool.frontends.connections import Connections, raise_fd_limit
from inferpool.frontends.grpc.aio import GrpcServer
from inferpool.frontends.grpc.h2 import GrpcH2Server
from inferpool.frontends.http1 import protocol_class
from inferpool.frontends.hypercorn_drain import DrainBodyFirst
from inferpool.frontends.listen import bind_socket
from inferpool.frontends.metrics import build_metrics_app
from inferpool.frontends.rest import build_app
from inferpool.settings import ServerSettings

logger = logging.getLogger("inferpool")


class _Uvicorn(uvicorn.Server):
    """Uvicorn without its own signal handling: the server's loop owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class RestServer:
    """An ASGI app on its own port: Uvicorn+httptools, or Hypercorn with ``--http2``.

    Uvicorn runs the guarded protocol (``http1.py``: timeouts, header and body limits, the
    connection registry). Hypercorn gets the equivalents its config has (``_hypercorn``).
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: ServerSettings,
        port: int,
        http2: bool = False,
        connections: Connections | None = None,
    ) -> None:
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
            http=protocol_class(self.settings, self.connections),
            loop="none",
            lifespan="off",
            access_log=False,
            log_level=self.settings.log_level.lower(),
            # Annotated int, but only handed to asyncio.wait_for: a float is exact.
            timeout_graceful_shutdown=self.settings.shutdown_timeout,  # type: ignore[arg-type]
        )
        self._uvicorn = _Uvicorn(config)
        self._task = asyncio.create_task(self._uvicorn.serve(sockets=[self.socket]))
        while not self._uvicorn.started and not self._task.done():
            await asyncio.sleep(0.01)

    async def _serve_hypercorn(self) -> None:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        config = _hypercorn_config(Config(), self.settings)
        config.loglevel = self.settings.log_level.upper()
        config.accesslog = None
        # Hypercorn binds by name; it re-creates the socket from the fd we already hold.
        config.bind = [f"fd://{self.socket.fileno()}"]
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
    try:
        # Every frontend's connections under one cap, bounded by the descriptors we may open.
        connections = Connections(settings.max_connections, raise_fd_limit())
        client = make_client(settings)
        servers: list[RestServer | GrpcServer | GrpcH2Server] = [
            RestServer(build_app(client), settings, settings.http_port, settings.http2, connections)
        ]
        if settings.grpc_port > 0:
            if settings.grpc_implementation == "builtin":
                servers.append(GrpcH2Server(client, settings, connections))
            else:
                servers.append(GrpcServer(client, settings))
        if settings.metrics_port > 0:
            metrics_app = build_metrics_app(client)
            servers.append(
                RestServer(metrics_app, settings, settings.metrics_port, False, connections)
            )
    except (OSError, SettingsError) as exc:  # SettingsError: e.g. an unreadable token file
        print(f"inferpool: {exc}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for server in servers:
        await server.start()
    logger.info("REST on http://%s:%d", settings.host, settings.http_port)
    if settings.grpc_port > 0:
        logger.info("gRPC on %s:%d", settings.host, settings.grpc_port)
    try:
        return await _start_then_wait(client, stop)
    finally:
        client.begin_shutdown()
        # Every frontend drains at once, each within the shutdown grace period.
        await asyncio.gather(*(server.stop() for server in servers))
        await client.close()


async def _start_then_wait(client: EngineClient, stop: asyncio.Event) -> int:
    """Start the engine (workers, then every model) unless a signal comes first, then
    wait for one; the exit code."""
    starting = asyncio.ensure_future(client.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            await asyncio.wait({starting})
            return 0
        try:
            statuses = starting.result()
        except FileNotFoundError as exc:
            print(f"inferpool: {exc}", file=sys.stderr)
            return 1
        except StartupFailed as exc:
            for reason in exc.reasons:
                print(f"inferpool: {reason}", file=sys.stderr)
            return 1
        not_ready = client.not_ready_reason()
        logger.info("started with %d model(s); %s", len(statuses), not_ready or "ready")
        await stopping
        logger.info("shutting down")
        return 0
    finally:
        stopping.cancel()
