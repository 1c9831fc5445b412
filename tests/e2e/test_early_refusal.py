"""Admission from the headers, adversarially: with a model's queue full, requests with
bodies of several MiB (sent whole, cut short, or trickled) are refused with 503 at once,
their bodies dropped unread, while another model keeps answering; nothing admitted is lost.

The same over gRPC (the builtin HTTP/2 server): a ModelInfer refused from its first DATA
frame, its message dropped unread.

One server (two workers, ``--max-queue 2``): ``blocked`` has one replica, whose predict
waits for a file to exist; ``fast`` sums its rows on both workers. Two requests fill
``blocked``'s queue; everything after them is refused from its headers. Before this
change a refusal came only after the whole body was read: the trickled ones would wait
for their body (``--body-timeout``, 60 s), and the frontend held every body whole.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import grpc
import httpx
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, write_custom_model

pytestmark = pytest.mark.timeout(300)

BLOCKED = """
import os
import time

from inferpool import Runtime


class Blocked(Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        deadline = time.monotonic() + 240
        while not os.path.exists({release!r}) and time.monotonic() < deadline:
            time.sleep(0.02)
        return {{outputs[0]: payload.sum(axis=1)}}
"""

SUM = """
from inferpool import Runtime


class Sum(Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        return {outputs[0]: payload.sum(axis=1)}
"""

TENSORS: dict[str, Any] = {
    "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 3]}],
    "outputs": [{"name": "sum", "datatype": "FP64", "shape": [-1]}],
}
MIB = 1 << 20
BODY_MIB = 6  # each large request's body
# Seconds a refusal may take on this shared machine: the old path answered a trickled
# body only after it had all arrived (never within this), or at --body-timeout (60 s).
REFUSED_WITHIN = 5.0


def small(row: list[float], request_id: str) -> bytes:
    tensor = {"name": "x", "datatype": "FP64", "shape": [1, 3], "data": row}
    return json.dumps({"id": request_id, "inputs": [tensor]}).encode()


def large_body() -> bytes:
    """A valid request of about ``BODY_MIB`` MiB (rows of three small numbers)."""
    rows = BODY_MIB * MIB // 12
    data = "[" + ",".join(["1,2,3"] * rows) + "]"
    head = f'{{"inputs":[{{"name":"x","datatype":"FP64","shape":[{rows},3],"data":'
    return (head + data + "}]}").encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    root = tmp_path_factory.mktemp("early")
    release = root / "release"
    repo = root / "repo"
    source = BLOCKED.format(release=str(release))
    write_custom_model(repo / "blocked", source, "Blocked", replicas=1, timeout=0, **TENSORS)
    write_custom_model(repo / "fast", SUM, "Sum", **TENSORS)
    args = ("--workers", "2", "--max-queue", "2", "--stall-threshold", "0")
    with Server(repo, *args) as running:
        running.wait_ready()
        yield running, release


def in_flight(server: Server, model: str) -> int:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    for line in text.splitlines():
        if line.startswith("inferpool_model_in_flight_requests{") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def frontend_memory(pid: int) -> tuple[int, int]:
    """The server process's VmRSS and VmHWM (peak), in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def head(port: int, length: int, request_id: str) -> bytes:
    return (
        f"POST /v2/models/blocked/infer HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {length}\r\n"
        f"x-request-id: {request_id}\r\n\r\n"
    ).encode()


def read_answer(reader: BinaryIO) -> tuple[str, dict[str, str], bytes]:
    """Status line, headers (lower-cased) and body of one HTTP/1.1 answer from ``reader``
    (a socket's ``makefile("rb")``: what follows the answer stays in its buffer)."""
    status = reader.readline().decode("latin-1").rstrip("\r\n")
    assert status, "connection closed before an answer"
    headers = {}
    while (line := reader.readline().decode("latin-1").rstrip("\r\n")) != "":
        name, _, value = line.partition(":")
        headers[name.lower()] = value.strip()
    body = reader.read(int(headers["content-length"]))
    return status, headers, body


def refused_raw(port: int, index: int, trickle: bool) -> float:
    """A request of ``BODY_MIB`` MiB whose body is cut short after 256 KiB, or trickled
    (a few bytes every 50 ms, all of it would take hours): answered 503 at once. Seconds
    from its headers to the whole answer."""
    body = large_body()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        started = time.monotonic()
        sock.sendall(head(port, len(body), f"raw-{index}"))
        answer: list[tuple[str, dict[str, str], bytes]] = []
        reading = threading.Thread(target=lambda: answer.append(read_answer(sock.makefile("rb"))))
        reading.start()
        sent = 0
        try:
            if not trickle:
                sock.sendall(body[: 256 * 1024])
            while trickle and reading.is_alive() and time.monotonic() - started < 10:
                sock.sendall(body[sent : sent + 16])
                sent += 16
                time.sleep(0.05)
        except OSError:
            pass  # the server closed after its answer: the rest is not wanted
        reading.join(30)
        seconds = time.monotonic() - started
    assert answer, "no answer"
    status, headers, text = answer[0]
    assert status.startswith("HTTP/1.1 503"), status
    assert "queue is full" in json.loads(text)["error"]
    assert headers["connection"] == "close" and headers["retry-after"] == "1"
    assert headers["x-request-id"] == f"raw-{index}"
    return seconds


def refused_whole(url: str, body: bytes) -> float:
    """A whole ``BODY_MIB`` MiB body as httpx sends it: 503 and the JSON error."""
    started = time.monotonic()
    response = httpx.post(f"{url}/v2/models/blocked/infer", content=body, timeout=60)
    assert response.status_code == 503, response.text
    assert "queue is full" in response.json()["error"]
    return time.monotonic() - started


def grpc_message(model: str) -> bytes:
    """A ModelInferRequest whose tensor is ``BODY_MIB`` MiB of raw bytes."""
    rows = BODY_MIB * MIB // 24
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP64", shape=[rows, 3])
    raw = b"\x00" * (rows * 24)
    request = pb.ModelInferRequest(model_name=model, inputs=[tensor], raw_input_contents=[raw])
    message: bytes = request.SerializeToString()
    return message


def refused_grpc(address: str, message: bytes) -> float:
    """ModelInfer of a large message: UNAVAILABLE with the queue-full text, at once."""
    started = time.monotonic()
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as raised:
            call(message, timeout=60)
    error = raised.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    assert "queue is full" in error.details()
    return time.monotonic() - started


def test_full_queues_refuse_large_bodies_unread_and_lose_nothing(
    server: tuple[Server, Path],
) -> None:
    running, release = server
    url, port = running.url, running.http_port
    with ThreadPoolExecutor(max_workers=32) as pool:
        # Fill blocked's queue (its worker holds 2, --max-queue 2).
        blocked = f"{url}/v2/models/blocked/infer"
        held = [
            pool.submit(httpx.post, blocked, content=small([i, 1, 1], f"h{i}"), timeout=240)
            for i in range(2)
        ]
        deadline = time.monotonic() + 60
        while in_flight(running, "blocked") < 2:
            assert time.monotonic() < deadline, "the queue never filled"
            time.sleep(0.05)

        # The other model's clients, meanwhile.
        stop = threading.Event()

        def fast_client() -> list[float]:
            latencies = []
            while not stop.is_set():
                started = time.monotonic()
                request = small([1, 2, 3], "f")
                response = httpx.post(f"{url}/v2/models/fast/infer", content=request, timeout=30)
                assert response.status_code == 200, response.text
                assert response.json()["outputs"][0]["data"] == [6.0]
                latencies.append(time.monotonic() - started)
            return latencies

        fast = [pool.submit(fast_client) for _ in range(2)]

        pid = running.process.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # peak RSS from now on
        rss_before, _ = frontend_memory(pid)
        body = large_body()
        refusals = [pool.submit(refused_whole, url, body) for _ in range(8)]
        refusals += [pool.submit(refused_raw, port, i, trickle=i % 2 == 1) for i in range(16)]
        message = grpc_message("blocked")
        refusals += [pool.submit(refused_grpc, running.grpc_address, message) for _ in range(8)]
        seconds = [refusal.result(timeout=120) for refusal in refusals]
        _, peak = frontend_memory(pid)
        stop.set()
        latencies = [latency for client in fast for latency in client.result(timeout=60)]

        # Each refused within the bound, though a trickled body takes hours to arrive.
        assert max(seconds) < REFUSED_WITHIN, sorted(seconds)
        # 8 whole bodies and 8 gRPC messages of 6 MiB arrived (16 more began): none held.
        assert peak - rss_before < 24 * MIB, (rss_before, peak)
        assert latencies and max(latencies) < REFUSED_WITHIN, max(latencies)

        # Released: what was admitted completes.
        release.touch()
        for index, future in enumerate(held):
            response = future.result(timeout=120)
            assert response.status_code == 200, response.text
            assert response.json()["outputs"][0]["data"] == [float(index + 2)]
    # Admitted from its headers now, and answered.
    response = httpx.post(f"{url}/v2/models/blocked/infer", content=body, timeout=60)
    assert response.status_code == 200, response.text
    stats = httpx.get(f"{url}/v2/models/blocked/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 3


def test_unknown_and_not_ready_models_are_refused_from_the_headers(
    server: tuple[Server, Path],
) -> None:
    """An unknown model's request is answered 404 before its body is sent at all."""
    running, _ = server
    port = running.http_port
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        reader = sock.makefile("rb")
        sock.sendall(
            b"POST /v2/models/nobody/infer?x=1 HTTP/1.1\r\nhost: x\r\n"
            b"content-length: 50000000\r\n\r\n"
        )
        status, headers, body = read_answer(reader)
    assert status.startswith("HTTP/1.1 404"), status
    assert json.loads(body) == {"error": "model 'nobody' not found"}
    assert headers["connection"] == "close" and headers["x-request-id"]
    # A small body is skipped instead, on a connection kept for the next request (here
    # pipelined behind it, and another after).
    small_body = small([1, 2, 3], "s")
    refused = (
        f"POST /v2/models/nobody/infer HTTP/1.1\r\nhost: x\r\n"
        f"content-length: {len(small_body)}\r\n\r\n"
    ).encode() + small_body
    live = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        reader = sock.makefile("rb")
        sock.sendall(refused + live)
        status, headers, _ = read_answer(reader)
        assert status.startswith("HTTP/1.1 404") and "connection" not in headers, headers
        assert read_answer(reader)[0].startswith("HTTP/1.1 200")
        sock.sendall(refused)
        assert read_answer(reader)[0].startswith("HTTP/1.1 404")
        sock.sendall(live)
        assert read_answer(reader)[0].startswith("HTTP/1.1 200")
