"""grpc.health.v1 Watch against a hostile client, on both gRPC servers: a connection that
opens many Watches, grants no flow-control window and never reads must not slow other
clients down nor keep their Watches from seeing changes, and its Watches are let go when
it disconnects."""

from __future__ import annotations

import socket
import statistics
import struct
import time

import grpc
import hpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.compat.test_health_grpc_e2e import (
    NOT_SERVING,
    SERVING,
    WatchRecorder,
    check,
    wait_for_log,
)
from tests.support import Server
from tests.support.grpc import IMPLEMENTATIONS
from tests.support.h2frames import (
    ACK,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    INITIAL_WINDOW_SIZE_SETTING,
    PREFACE,
    SETTINGS,
    FrameReader,
    frame,
    grpc_frame,
    request_headers,
    window_update,
)

WATCH = b"/grpc.health.v1.Health/Watch"
HOSTILE_WATCHES = 100


def open_hostile_watches(port: int, service: str, count: int) -> socket.socket:
    """A connection with ``count`` Watch calls on ``service`` that grants the server no
    window for its answers (SETTINGS_INITIAL_WINDOW_SIZE 0) and is never read again."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    no_window = struct.pack(">HI", INITIAL_WINDOW_SIZE_SETTING, 0)
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0, no_window))
    sock.recv(1 << 16)  # the server's SETTINGS, to acknowledge; nothing is read after
    encoder = hpack.Encoder()
    message = grpc_frame(health_pb2.HealthCheckRequest(service=service).SerializeToString())
    chunks = [frame(SETTINGS, ACK, 0)]
    for stream_id in range(1, 2 * count, 2):
        block = encoder.encode(request_headers(WATCH))
        chunks.append(frame(HEADERS, END_HEADERS, stream_id, block))
        chunks.append(frame(DATA, END_STREAM, stream_id, message))
    sock.sendall(b"".join(chunks))
    return sock


def read_messages(sock: socket.socket, seconds: float) -> tuple[list[int], bool]:
    """The Watch statuses that arrive on stream 1 within ``seconds``, and whether the
    stream ended."""
    reader = FrameReader(keep_data=True)
    data, ended = b"", False
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            break
        if not chunk:
            break
        for f in reader.feed(chunk):
            if f.stream_id == 1 and f.kind == DATA:
                data += f.payload
            ended = ended or (f.stream_id == 1 and bool(f.flags & END_STREAM))
    statuses = []
    while data:
        length = int.from_bytes(data[1:5], "big")
        statuses.append(health_pb2.HealthCheckResponse.FromString(data[5 : 5 + length]).status)
        data = data[5 + length :]
    return statuses, ended


def check_latencies(stub: health_pb2_grpc.HealthStub, calls: int = 30) -> list[float]:
    latencies = []
    for _ in range(calls):
        started = time.perf_counter()
        assert check(stub, "") == SERVING
        latencies.append(time.perf_counter() - started)
    return latencies


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_watches_that_never_read_hurt_nobody_and_are_let_go(implementation, iris_repo):
    flags = ("--workers", "0", "--grpc-implementation", implementation, "--access-log")
    with (
        Server(iris_repo, *flags) as server,
        grpc.insecure_channel(server.grpc_address) as channel,
    ):
        server.wait_ready()
        health = health_pb2_grpc.HealthStub(channel)
        inference = GRPCInferenceServiceStub(channel)
        before = check_latencies(health)
        hostile = open_hostile_watches(server.grpc_port, "iris-rf", HOSTILE_WATCHES)
        late = open_hostile_watches(server.grpc_port, "iris-rf", 1)
        try:
            time.sleep(1.0)  # the server takes every call in
            watch = WatchRecorder(health, "iris-rf")
            expected = [SERVING]
            watch.wait_for(expected)
            # Each change is offered to the hostile Watches too; the reader sees all. An
            # unloaded model stays listed (UNAVAILABLE), a service that does not serve.
            for _ in range(3):
                unload = pb.RepositoryModelUnloadRequest(model_name="iris-rf")
                inference.RepositoryModelUnload(unload, timeout=20)
                expected.append(NOT_SERVING)
                watch.wait_for(expected, timeout=5)
                inference.RepositoryModelLoad(
                    pb.RepositoryModelLoadRequest(model_name="iris-rf"), timeout=20
                )
                expected.append(SERVING)
                watch.wait_for(expected, timeout=5)
            during = check_latencies(health)
            # Loose bounds (the test machine is shared): a server busy with the blocked
            # Watches, or waiting on them, would be off by seconds.
            assert max(during) < 2.0
            assert statistics.median(during) < statistics.median(before) + 0.25
            # A reader that grants window late gets the first status, then the newest
            # (the builtin server keeps one message per Watch; grpc.aio may keep more).
            unload = pb.RepositoryModelUnloadRequest(model_name="iris-rf")
            inference.RepositoryModelUnload(unload, timeout=20)
            watch.wait_for([*expected, NOT_SERVING], timeout=5)
            late.sendall(window_update(1, 1 << 20))
            statuses, ended = read_messages(late, 2.0)
            assert not ended
            assert statuses[0] == SERVING and statuses[-1] == NOT_SERVING
            if implementation == "builtin":
                assert statuses == [SERVING, NOT_SERVING]
        finally:
            hostile.close()
            late.close()
        # Every hostile Watch ends when its connection does (CANCELLED in the access log).
        pattern = r"gRPC Watch peer=\S+ model=- version=- status=CANCELLED"
        wait_for_log(server, pattern, HOSTILE_WATCHES + 1)
        watch.call.cancel()
        wait_for_log(server, pattern, HOSTILE_WATCHES + 2)
