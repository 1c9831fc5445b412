"""The builtin gRPC server (``frontends/grpc/h2.py``) in this process, on an in-process engine
with no model and no worker (its loop in a thread), driven by hand-made HTTP/2 frames:
grpc.health.v1 Check and Watch (a message per status, the deadline, a malformed request,
the client's reset letting the Watch go, the server's stop ending it with OK), a method
not served answered at its headers while its body still streams, a content type that is
not gRPC (415), a message refused from its 5-byte prefix, and a bad grpc-timeout on
ModelStreamInfer. A live server's Health with grpcio's stubs:
tests/compat/test_health_grpc_e2e.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferpool.engine.inprocess import InProcessClient
from inferpool.frontends.grpc.h2 import GrpcH2Server
from inferpool.protocol.health import ENCODED, ServingStatus
from inferpool.settings import ServerSettings
from tests.support import free_port, write_custom_model
from tests.support.h2client import RawConnection
from tests.support.h2frames import (
    CANCEL,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    INTERNAL,
    NOT_FOUND,
    OK,
    RST_STREAM,
    SERVICE,
    UNIMPLEMENTED,
    frame,
    grpc_frame,
    request_headers,
)

CHECK = b"/grpc.health.v1.Health/Check"
WATCH = b"/grpc.health.v1.Health/Watch"
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED = 4, 8
MAX_MESSAGE = 1000


# The one model served: a model's name is a service of its own.
TINY = """
import numpy as np

from inferpool import Runtime


class Tiny(Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        return {"output-0": np.asarray(payload)}
"""


def health_request(service: str) -> bytes:
    encoded = service.encode()
    return b"\x0a" + bytes((len(encoded),)) + encoded if encoded else b""


class LoopThread:
    """A GrpcH2Server and its in-process engine on an asyncio loop in a thread."""

    def __init__(self, repository: Path) -> None:
        self.port = free_port()
        self.settings = ServerSettings(
            model_repository=repository,
            workers=0,
            host="127.0.0.1",
            grpc_port=self.port,
            max_body_bytes=MAX_MESSAGE,
            shutdown_timeout=2,
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: GrpcH2Server = self.run(self._start())

    def run(self, work: Any) -> Any:
        """Run a coroutine on the server's loop; its result."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout=60)

    def call(self, function: Any) -> Any:
        """Call ``function()`` on the server's loop; its result."""

        async def inside() -> Any:
            return function()

        return self.run(inside())

    async def _start(self) -> GrpcH2Server:
        self.client = InProcessClient(self.settings)
        await self.client.start()
        server = GrpcH2Server(self.client, self.settings)
        await server.start()
        return server

    def stop(self) -> None:
        self.run(self.server.stop())
        self.run(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[LoopThread]:
    repository = tmp_path_factory.mktemp("tiny")
    write_custom_model(repository / "tiny", TINY, "Tiny")
    running = LoopThread(repository)
    try:
        yield running
    finally:
        running.stop()


def open_call(
    connection: RawConnection,
    stream_id: int,
    path: bytes,
    body: bytes | None,
    extra: tuple = (),
    content_type: bytes | None = b"application/grpc",
) -> None:
    """HEADERS for ``path``, then ``body`` as one DATA frame ending the stream (none: the
    stream stays open)."""
    block = connection.block(request_headers(path, content_type, extra))
    connection.send(frame(HEADERS, END_HEADERS, stream_id, block))
    if body is not None:
        connection.send(frame(DATA, END_STREAM, stream_id, body))


def messages_of(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos + 1 : pos + 5], "big")
        assert data[pos] == 0
        out.append(bytes(data[pos + 5 : pos + 5 + length]))
        pos += 5 + length
    return out


# -- grpc.health.v1 ------------------------------------------------------------------------
def test_check_answers_for_the_server_and_refuses_an_unknown_service(server):
    with RawConnection(server.port) as connection:
        open_call(connection, 1, CHECK, grpc_frame(health_request("")))
        open_call(connection, 3, CHECK, grpc_frame(health_request("no-such-model")))
        open_call(connection, 5, CHECK, grpc_frame(health_request("tiny")))
        for stream_id in (1, 5):
            serving = connection.reply(stream_id)
            assert serving.status == OK
            assert messages_of(serving.data) == [ENCODED[ServingStatus.SERVING]]
        unknown = connection.reply(3)
        assert unknown.status == NOT_FOUND
        assert unknown.message == "unknown service 'no-such-model'"


def test_watch_sends_the_status_then_ends_at_its_deadline(server):
    with RawConnection(server.port) as connection:
        timeout = ((b"grpc-timeout", b"300m"),)
        open_call(connection, 1, WATCH, grpc_frame(health_request("")), timeout)
        open_call(connection, 3, WATCH, grpc_frame(health_request("later-model")), timeout)
        for stream_id, status in ((1, ServingStatus.SERVING), (3, ServingStatus.SERVICE_UNKNOWN)):
            reply = connection.reply(stream_id)
            assert dict(reply.headers)[b":status"] == b"200"
            assert messages_of(reply.data) == [ENCODED[status]]  # once: it did not change
            assert reply.status == DEADLINE_EXCEEDED
    assert server.call(lambda: len(server.server.health.watchers)) == 0


def test_a_malformed_watch_request_is_internal(server):
    with RawConnection(server.port) as connection:
        open_call(connection, 1, WATCH, grpc_frame(b"\x0a\x05ab"))  # a string cut short
        reply = connection.reply(1)
        assert reply.status == INTERNAL
        assert reply.message == "cannot parse the Watch request"
        assert reply.data == b""  # Trailers-Only: no message was sent


def test_a_watch_the_client_resets_is_let_go(server):
    with RawConnection(server.port) as connection:
        open_call(connection, 1, WATCH, grpc_frame(health_request("")))
        while not connection.replies[1].data:
            assert connection.read(), "the server closed the connection"
        assert server.call(lambda: len(server.server.health.watchers)) == 1
        connection.send(frame(RST_STREAM, 0, 1, CANCEL.to_bytes(4, "big")))
        for _ in range(200):
            if server.call(lambda: len(server.server.health.watchers)) == 0:
                break
            threading.Event().wait(0.02)
        assert server.call(lambda: len(server.server.health.watchers)) == 0


# -- calls refused before or at their headers ---------------------------------------------
def test_a_method_not_served_is_answered_while_its_body_streams(server):
    with RawConnection(server.port) as connection:
        open_call(connection, 1, SERVICE + b"NoSuchMethod", None)  # its body never ends
        reply = connection.reply(1)
        assert reply.status == UNIMPLEMENTED
        assert reply.message == "unknown method /inference.GRPCInferenceService/NoSuchMethod"
        # The same for a whole call to a path of no service.
        open_call(connection, 3, b"/other.Service/Call", grpc_frame(b""))
        assert connection.reply(3).status == UNIMPLEMENTED


def test_a_request_that_is_not_grpc_is_415(server):
    with RawConnection(server.port) as connection:
        open_call(connection, 1, CHECK, b"{}", content_type=b"application/json")
        reply = connection.reply(1)
        assert dict(reply.headers)[b":status"] == b"415"
        assert reply.ended


def test_a_message_over_the_limit_is_refused_from_its_prefix(server):
    with RawConnection(server.port) as connection:
        block = connection.block(request_headers(CHECK))
        connection.send(frame(HEADERS, END_HEADERS, 1, block))
        # Only the prefix: the server refuses before the message's bytes come.
        prefix = b"\x00" + (MAX_MESSAGE + 1).to_bytes(4, "big")
        connection.send(frame(DATA, 0, 1, prefix))
        reply = connection.reply(1)
        assert reply.status == RESOURCE_EXHAUSTED
        assert f"{MAX_MESSAGE + 1} bytes" in reply.message


def test_a_stream_call_with_a_bad_grpc_timeout_is_refused_at_its_headers(server):
    with RawConnection(server.port) as connection:
        bad = ((b"grpc-timeout", b"soon"),)
        open_call(connection, 1, SERVICE + b"ModelStreamInfer", None, bad)
        reply = connection.reply(1)
        assert reply.status != OK and "grpc-timeout" in reply.message


def test_stop_ends_an_open_watch_with_ok(tmp_path):
    write_custom_model(tmp_path / "tiny", TINY, "Tiny")
    running = LoopThread(tmp_path)
    try:
        with RawConnection(running.port) as connection:
            open_call(connection, 1, WATCH, grpc_frame(health_request("")))
            while not connection.replies[1].data:
                assert connection.read(), "the server closed the connection"
            stopping = asyncio.run_coroutine_threadsafe(running.server.stop(), running.loop)
            reply = connection.reply(1)
            assert reply.status == OK
            assert messages_of(reply.data)[0] == ENCODED[ServingStatus.SERVING]
            stopping.result(timeout=30)
    finally:
        running.run(running.client.close())
        running.loop.call_soon_threadsafe(running.loop.stop)
        running.thread.join(timeout=10)
        running.loop.close()
