"""Hostile peers of ``ModelStreamInfer`` on the builtin HTTP/2 gRPC server, with hand-made
frames: a message length prefix that lies (over the limit; or within it, then silence), a
client that floods requests and never reads the answers, and a stream that ends inside a
message. Each gets its gRPC status at once (or at its deadline, for the silent one),
while fresh health checks and another client's unary call keep their latency, and the
frontend's memory comes back afterwards."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.support import Server, build_iris_repository
from tests.support.grpc import infer_request, stub_for
from tests.support.h2client import Client
from tests.support.h2frames import SERVICE, grpc_frame, request_headers
from tests.support.pool import wait_for
from tests.support.probes import HealthProbe, rss_mib

MAX_BODY = 1_000_000  # --max-body-bytes: the limit of one message and of what waits unread
STREAM = SERVICE + b"ModelStreamInfer"
RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, INTERNAL = 8, 4, 13
ROWS = np.array([[5.1, 3.5, 1.4, 0.2]])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = build_iris_repository(tmp_path_factory.mktemp("stream-hostile"))
    args = ("--workers", "2", "--max-body-bytes", str(MAX_BODY))
    with Server(repository, *args) as running:
        running.wait_ready()
        yield running


def iris_message() -> bytes:
    return infer_request("iris-logreg", x=ROWS).SerializeToString()


def unary_latency(server: Server) -> float:
    """Seconds another client's ModelInfer takes; it must answer."""
    started = time.monotonic()
    with stub_for(server) as stub:
        response = stub.ModelInfer(infer_request("iris-logreg", x=ROWS), timeout=10)
    assert response.outputs
    return time.monotonic() - started


def open_stream(client: Client, *extra: tuple[bytes, bytes]) -> int:
    stream_id = client.h2.get_next_available_stream_id()
    client.h2.send_headers(stream_id, request_headers(STREAM, extra=extra))
    client.flush()
    return stream_id


def test_a_length_prefix_over_the_limit_is_refused_at_once(server: Server) -> None:
    with HealthProbe(server), Client(server.grpc_port) as client:
        stream_id = open_stream(client)
        lying = b"\x00" + (100_000_000).to_bytes(4, "big") + b"x" * 100
        started = time.monotonic()
        client.send_body(stream_id, lying, end_stream=False)
        reply = client.reply(stream_id)
        assert time.monotonic() - started < 2
        assert reply.status == RESOURCE_EXHAUSTED
        assert str(MAX_BODY) in reply.message
        assert unary_latency(server) < 1.5


def test_a_prefix_within_the_limit_then_silence_ends_at_the_deadline(server: Server) -> None:
    with HealthProbe(server), Client(server.grpc_port) as client:
        stream_id = open_stream(client, (b"grpc-timeout", b"2S"))
        client.send_body(stream_id, b"\x00" + (500_000).to_bytes(4, "big") + b"x" * 10, False)
        started = time.monotonic()
        reply = client.reply(stream_id)
        assert 1.5 < time.monotonic() - started < 5
        assert reply.status == DEADLINE_EXCEEDED
        assert unary_latency(server) < 1.5


def test_a_stream_that_ends_inside_a_message_is_an_error(server: Server) -> None:
    with Client(server.grpc_port) as client:
        stream_id = open_stream(client)
        whole = grpc_frame(iris_message())
        client.send_body(stream_id, whole + whole[:7], end_stream=True)
        reply = client.reply(stream_id)
        assert reply.status == INTERNAL
        assert "inside a message" in reply.message


def test_a_flood_never_read_waits_bounded_and_the_memory_comes_back(server: Server) -> None:
    """Requests sent as fast as the windows allow, the answers not read (the client's
    receive window closes after 64 KiB of them): the server keeps at most ``MAX_BODY``
    bytes of requests waiting instead of buffering the flood. Once the client reads, it
    gets the answers of what was kept, then RESOURCE_EXHAUSTED; the memory comes back."""
    import h2.events

    pid = server.process.pid
    baseline = rss_mib(pid)
    frame = grpc_frame(iris_message())
    flood = frame * (3 * MAX_BODY // len(frame))
    with HealthProbe(server), Client(server.grpc_port, auto_ack=False) as client:
        stream_id = open_stream(client)
        client.send_body(stream_id, flood, end_stream=False)
        client.quiet(0.5)
        assert not client.replies[stream_id].done  # its answers wait for the window
        assert rss_mib(pid) < baseline + 20  # 3 MB sent; at most 1 MB of them kept
        assert unary_latency(server) < 1.5
        unread = sum(
            event.flow_controlled_length
            for event in client.events
            if isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id
        )
        client.auto_ack = True
        client.h2.acknowledge_received_data(unread, stream_id)
        client.flush()
        reply = client.reply(stream_id, timeout=30)
        assert reply.status == RESOURCE_EXHAUSTED, reply.message
        assert "wait unanswered" in reply.message
        assert len(reply.data) > 64 * 1024  # the kept requests were answered first
    wait_for(lambda: rss_mib(pid) <= baseline * 1.1 + 5, 10, "the frontend's memory back")
