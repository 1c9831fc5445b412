"""Slow readers hold bounded memory, and give it back (issue 37, points 6 and 7).

Clients on raw sockets ask a custom model for answers of a few MiB and read them slowly
(64 KiB every 50 ms; over gRPC the window is granted only for what was read), or, over
HTTP/2, never open their stream windows at all (SETTINGS_INITIAL_WINDOW_SIZE 0, no
WINDOW_UPDATE). The frontend keeps at most ``--max-unsent-bytes`` of unread answers in
total and ``--max-unsent-bytes-per-connection`` per connection beyond its first answer:
past them a large answer is refused (REST 503 with Retry-After, gRPC RESOURCE_EXHAUSTED,
both naming the setting). Each test asserts those answers; that what the frontend's RSS
held once every answer was out of the workers stayed within the bound plus one answer
(without the bounds it held every answer), and came back within 20 MiB of where it
started; and that other clients (health checks, a small model's inferences) kept their
latency meanwhile. Both engines: ``--workers 2`` and ``--workers 0``.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.settings
import httpx
import pytest

from benchmarks.slow_readers import CHUNK, PAUSE, read_rest_answer
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, build_iris_repository, write_custom_model
from tests.support.h2client import Client, RawConnection
from tests.support.h2frames import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    INITIAL_WINDOW_SIZE_SETTING,
    PREFACE,
    SETTINGS,
    FlowAudit,
    frame,
    grpc_frame,
    request_headers,
)
from tests.support.probes import HealthProbe
from tests.support.slow_readers import (
    BIG_RUNTIME,
    Memory,
    SmallInferences,
    latency,
    run_all,
    small_latency,
)

MIB = 1 << 20
TOTAL = 16 * MIB  # --max-unsent-bytes
PER_CONNECTION = 4 * MIB  # --max-unsent-bytes-per-connection
# Longer than a slow reader takes to read an answer (8.6 MiB at 1.3 MB/s): a REST answer
# must be read down within it.
WRITE_TIMEOUT = 10.0
RESOURCE_EXHAUSTED = 8
SLACK = 12  # MiB the frontend's RSS may show beyond what it holds (its heap, the probes)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = build_iris_repository(tmp_path_factory.mktemp("slow-readers"))
    write_custom_model(root / "big", BIG_RUNTIME, "Big")
    return root


@pytest.fixture(scope="module", params=["2", "0"], ids=["workers-2", "workers-0"])
def server(request, repo) -> Iterator[Server]:
    flags = (
        "--workers", request.param,
        "--max-unsent-bytes", str(TOTAL),
        "--max-unsent-bytes-per-connection", str(PER_CONNECTION),
        "--write-timeout", str(WRITE_TIMEOUT),
    )  # fmt: skip
    with Server(repo, *flags) as server:
        server.wait_ready()
        server.workers = int(request.param)
        yield server


# -- REST ---------------------------------------------------------------------------------
def slow_rest_reader(server: Server, count: int, on_head: Callable[[], None]) -> tuple[str, str]:
    """One request; its answer read 64 KiB every 50 ms: ("200", "") once read whole, else
    the status and the error."""
    status, head, body = read_rest_answer(server.http_port, count, True, on_head)
    assert status not in ("closed", "cut"), (status, head)
    if status == "200":
        return status, ""
    assert b"retry-after: 1" in head.lower().split(b"\r\n"), head
    return status, body.decode()


def test_slow_rest_readers_hold_bounded_memory_and_give_it_back(server):
    """30 readers of 8.6 MiB answers (the kernel's socket buffers take about 4 MiB of each
    on loopback, the frontend keeps the rest, and the whole answer until it is sent): 258
    MiB unbounded (twice that before answers were written without a copy); the answers past
    16 MiB are refused 503 instead."""
    count = 4_500_000
    memory = Memory(server.process.pid)
    with (
        HealthProbe(server, latency(server)),
        SmallInferences(server, small_latency(server)),
        memory,
    ):
        outcomes, messages = run_all(partial(slow_rest_reader, server, count), 30, memory)
    assert set(outcomes) <= {"200", "503"}, outcomes
    assert outcomes["200"] >= 1, outcomes  # at least one answer at a time is served
    assert outcomes["503"] >= 3, outcomes  # and the rest refused
    refusal = next(m for m in messages if m)
    assert "max_unsent_bytes=16777216" in json.loads(refusal)["error"], refusal
    memory.assert_held_under(TOTAL / MIB + 9 + SLACK)  # the bound and one answer
    memory.assert_back()


def test_one_answer_larger_than_the_bounds_is_still_served(server):
    """A connection that holds nothing gets its answer whatever its size: the bounds limit
    what piles up, not what may be asked (24 MB over a 16 MiB total)."""
    status, _ = slow_rest_reader_fast(server, 12_000_000)
    assert status == "200"


def slow_rest_reader_fast(server: Server, count: int) -> tuple[str, str]:
    with httpx.Client(timeout=60) as client:
        tensor = {"name": "big", "datatype": "INT64", "shape": [1], "data": [count]}
        response = client.post(f"{server.url}/v2/models/big/infer", json={"inputs": [tensor]})
        return str(response.status_code), response.text[:200]


# -- gRPC (the builtin HTTP/2 server) -------------------------------------------------------
def infer_message(count: int) -> bytes:
    request = pb.ModelInferRequest(model_name="big")
    tensor = request.inputs.add(name="big", datatype="INT64", shape=[1])
    tensor.contents.int64_contents.append(count)
    return request.SerializeToString()


def slow_grpc_reader(server: Server, count: int, on_head: Callable[[], None]) -> tuple[str, str]:
    """One ModelInfer over ``h2`` whose answer is read ``CHUNK`` every ``PAUSE``, window
    granted for what was read: its grpc-status and grpc-message."""
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=60) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CHUNK)
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        conn = h2.connection.H2Connection(config=config)
        initial = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 * MIB}
        conn.local_settings = h2.settings.Settings(client=True, initial_values=initial)
        conn.initiate_connection()
        conn.send_headers(1, request_headers())
        conn.send_data(1, grpc_frame(infer_message(count)), end_stream=True)
        sock.sendall(conn.data_to_send())
        metadata: dict[bytes, bytes] = {}
        while True:
            time.sleep(PAUSE)
            data = sock.recv(CHUNK)
            assert data, "the server closed the connection"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.ResponseReceived):
                    metadata.update(event.headers)
                    on_head()
                elif isinstance(event, h2.events.TrailersReceived):
                    metadata.update(event.headers)
                elif isinstance(event, h2.events.StreamEnded):
                    status = metadata[b"grpc-status"].decode()
                    return status, metadata.get(b"grpc-message", b"").decode()
                assert not isinstance(event, h2.events.StreamReset), event
            sock.sendall(conn.data_to_send())


def test_slow_grpc_readers_hold_bounded_memory_and_give_it_back(server):
    """30 readers of 4 MiB answers: the answers past 16 MiB are RESOURCE_EXHAUSTED."""
    count = -(4 * MIB // 8)
    memory = Memory(server.process.pid)
    with (
        HealthProbe(server, latency(server)),
        SmallInferences(server, small_latency(server)),
        memory,
    ):
        outcomes, messages = run_all(partial(slow_grpc_reader, server, count), 30, memory)
    assert set(outcomes) <= {"0", str(RESOURCE_EXHAUSTED)}, outcomes
    assert outcomes["0"] >= 3, outcomes
    assert outcomes[str(RESOURCE_EXHAUSTED)] >= 3, outcomes
    assert any("max_unsent_bytes=16777216" in m for m in messages), messages
    memory.assert_held_under(TOTAL / MIB + 4 + SLACK)  # the bound and one answer
    memory.assert_back()


# -- gRPC: a peer that never opens its stream windows ---------------------------------------
def windowless(server: Server) -> RawConnection:
    """A raw HTTP/2 connection that sets SETTINGS_INITIAL_WINDOW_SIZE 0 and will never
    send WINDOW_UPDATE: no answer's DATA can ever reach it."""
    raw = RawConnection(server.grpc_port, handshake=False)
    raw.handshake = True  # its SETTINGS are acknowledged from now on
    raw.audit = FlowAudit(0)  # and any DATA the server sends fails the test
    raw.send(PREFACE, frame(SETTINGS, 0, 0, struct.pack(">HI", INITIAL_WINDOW_SIZE_SETTING, 0)))
    return raw


def test_a_peer_that_never_opens_its_window_holds_bounded_memory(server):
    """150 calls of 576 KB answers on one connection that gives no window: 83 MiB held
    before the bound; now at most 4 MiB plus one answer, the others RESOURCE_EXHAUSTED at
    once naming the bound, and after the write timeout the held ones are reset (CANCEL)."""
    calls, count = 150, -72_000
    memory = Memory(server.process.pid)
    with (
        HealthProbe(server, latency(server)),
        SmallInferences(server, small_latency(server)),
        memory,
        windowless(server) as raw,
    ):
        message = grpc_frame(infer_message(count))
        for i in range(calls):
            stream_id = 2 * i + 1
            raw.send(
                frame(HEADERS, END_HEADERS, stream_id, raw.block(request_headers())),
                frame(DATA, END_STREAM, stream_id, message),
            )
        deadline = time.monotonic() + 60
        while (
            time.monotonic() < deadline
            and sum(bool(r.headers) for r in raw.replies.values()) < calls
        ):
            raw.read(10)
        replies = [raw.replies[2 * i + 1] for i in range(calls)]
        refused = [r for r in replies if r.ended]
        held = [r for r in replies if r.headers and not r.ended]
        assert all(r.status == RESOURCE_EXHAUSTED for r in refused)
        assert "max_unsent_bytes_per_connection" in refused[0].message, refused[0].message
        assert len(held) <= PER_CONNECTION // 576_000 + 1, len(held)
        assert len(refused) + len(held) == calls
        # The refused answers (576 KB each: from the heap) are freed, and given back by
        # the trim that follows a moment later (frontends/reclaim.py).
        time.sleep(2)
        memory.hold()
        memory.assert_held_under(PER_CONNECTION / MIB + 1 + SLACK)
        # The write timeout resets the streams whose answers wait for window (CANCEL).
        deadline = time.monotonic() + WRITE_TIMEOUT + 10
        while time.monotonic() < deadline and not all(r.done for r in held):
            raw.read(WRITE_TIMEOUT + 10)
        assert all(r.reset is not None for r in held), held
    memory.assert_back()
    with Client(server.grpc_port) as client:
        assert client.call(infer_message(-1_000)).status == 0


def test_new_calls_of_a_connection_past_its_bound_are_refused_on_arrival(server):
    """Once a connection holds more unread answers than its bound (one 6 MiB answer that
    its peer gives no window for), its new calls are refused as they arrive, before any
    model runs them: RESOURCE_EXHAUSTED naming the bound, on trailers that need no window."""
    with HealthProbe(server, latency(server)), windowless(server) as raw:
        message = grpc_frame(infer_message(-(6 * MIB // 8)))
        raw.send(
            frame(HEADERS, END_HEADERS, 1, raw.block(request_headers())),
            frame(DATA, END_STREAM, 1, message),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not raw.replies[1].headers:
            raw.read(10)
        assert not raw.replies[1].ended  # its answer waits for window
        small = grpc_frame(infer_message(-10))
        for stream_id in range(3, 43, 2):
            raw.send(
                frame(HEADERS, END_HEADERS, stream_id, raw.block(request_headers())),
                frame(DATA, END_STREAM, stream_id, small),
            )
        replies = [raw.replies[stream_id] for stream_id in range(3, 43, 2)]
        while time.monotonic() < deadline and not all(r.ended for r in replies):
            raw.read(10)
        for reply in replies:
            assert reply.status == RESOURCE_EXHAUSTED
            assert reply.message.startswith("this connection holds 6.0 MiB"), reply.message
            assert "max_unsent_bytes_per_connection=4194304" in reply.message


# -- grpc.aio ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def grpcio(repo) -> Iterator[Server]:
    with Server(repo, "--workers", "2", "--grpc-implementation", "grpcio") as server:
        server.wait_ready()
        server.workers = 2
        yield server


def test_grpcio_holds_a_windowless_peers_answers_and_gives_them_back(grpcio):
    """grpc.aio's C-core owns the flow control: the bounds cannot see what it holds, and it
    keeps all 150 answers of the windowless peer. Once the peer is gone, the frontend's
    periodic trim gives the memory back (without it, 88-146 MiB stayed for 15 s)."""
    calls = 150
    memory = Memory(grpcio.process.pid)
    with HealthProbe(grpcio, latency(grpcio)), memory, windowless(grpcio) as raw:
        message = grpc_frame(infer_message(-72_000))
        for i in range(calls):
            stream_id = 2 * i + 1
            raw.send(
                frame(HEADERS, END_HEADERS, stream_id, raw.block(request_headers())),
                frame(DATA, END_STREAM, stream_id, message),
            )
        replies = [raw.replies[2 * i + 1] for i in range(calls)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(r.headers for r in replies):
            raw.read(10)
        assert not any(r.ended for r in replies)  # all held: no bound applies
        memory.hold()
        assert memory.held - memory.baseline > 60  # 150 answers of 576 KB
    memory.assert_back(wait=15)  # a trim every 10 s
