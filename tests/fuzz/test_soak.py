"""A bounded soak: mixed good and hostile traffic with random worker kills, then a check
that the server answers right and gave back its memory, descriptors and memfds.

60 s by default (``INFERPOOL_SOAK_SECONDS``). Good requests must be answered with the right
values, or with 503 while a killed worker's replacement starts. Hostile requests must be
answered 4xx (or their connection closed for a protocol error), never 500 and never a
worker crash: every worker death in the run is one of ours.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import threading
import time
from collections import Counter

import grpc
import httpx
import numpy as np
import psutil
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, build_iris_repository
from tests.support.pool import wait_for

SOAK_SECONDS = float(os.environ.get("INFERPOOL_SOAK_SECONDS", "60"))
ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]
GOOD_JSON = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP64", "data": ROWS}]}


def hostile_rest_requests() -> list[tuple[str, bytes, dict[str, str]]]:
    """(what, body, headers) of requests a client must never be able to hurt us with."""
    deep = b"[" * 5000 + b"]" * 5000
    lying_bytes = {
        "inputs": [
            {
                "name": "x",
                "shape": [300_000_000],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": 8},
            }
        ]
    }
    header = json.dumps(lying_bytes).encode()
    return [
        ("not json", b"{nope", {}),
        ("deep json", b'{"inputs": ' + deep + b"}", {}),
        (
            "huge shape",
            json.dumps(
                {**GOOD_JSON, "inputs": [{**GOOD_JSON["inputs"][0], "shape": [10**12, 4]}]}
            ).encode(),
            {},
        ),
        (
            "shape overflow",
            json.dumps(
                {
                    "inputs": [
                        {"name": "x", "shape": [2**62, 2**62], "datatype": "FP32", "data": [1]}
                    ]
                }
            ).encode(),
            {},
        ),
        (
            "lying BYTES",
            header + b"\x04\x00\x00\x00abcd",
            {"Inference-Header-Content-Length": str(len(header))},
        ),
        (
            "header length > int64",
            json.dumps(GOOD_JSON).encode(),
            {"Inference-Header-Content-Length": str(2**70)},
        ),
        (
            "negative header length",
            json.dumps(GOOD_JSON).encode(),
            {"Inference-Header-Content-Length": "-5"},
        ),
        (
            "strings for numbers",
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": "x",
                            "shape": [1, 4],
                            "datatype": "BYTES",
                            "data": ["a", "b", "c", "d"],
                        }
                    ]
                }
            ).encode(),
            {},
        ),
        (
            "zero rows",
            json.dumps(
                {"inputs": [{"name": "x", "shape": [0, 4], "datatype": "FP64", "data": []}]}
            ).encode(),
            {},
        ),
        ("duplicate inputs", json.dumps({"inputs": [GOOD_JSON["inputs"][0]] * 2}).encode(), {}),
    ]


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def footprint(pid: int) -> dict[str, int]:
    """RSS of the whole tree, the frontend's fds, and memfds open anywhere in the tree."""
    rss = fds = memfds = 0
    for proc in tree(pid):
        try:
            rss += proc.memory_info().rss
            links = [
                os.readlink(f"/proc/{proc.pid}/fd/{fd}")
                for fd in os.listdir(f"/proc/{proc.pid}/fd")
            ]
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue
        memfds += sum(link.startswith("/memfd:") for link in links)
        if proc.pid == pid:
            fds = len(links)
    return {"rss": rss, "fds": fds, "memfds": memfds}


def workers_of(pid: int) -> list[psutil.Process]:
    """Worker processes: children of the template, itself a child of the server."""
    return [proc for child in psutil.Process(pid).children() for proc in child.children()]


def grpc_raw_request() -> bytes:
    request = pb.ModelInferRequest(model_name="iris-logreg")
    tensor = request.inputs.add(name="x", datatype="FP64", shape=[2, 4])
    del tensor
    request.raw_input_contents.append(np.asarray(ROWS, "<f8").tobytes())
    return request.SerializeToString()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = build_iris_repository(tmp_path_factory.mktemp("soak"))
    with Server(repository, "--workers", "2", "--shutdown-timeout", "10") as running:
        running.wait_ready(120)
        yield running


def test_mixed_hostile_traffic_with_worker_kills_leaves_nothing_behind(server: Server):
    url = f"{server.url}/v2/models/iris-logreg/infer"
    stop = threading.Event()
    outcomes: Counter[str] = Counter()
    problems: list[str] = []
    lock = threading.Lock()

    def record(key: str, problem: str | None = None) -> None:
        with lock:
            outcomes[key] += 1
            if problem is not None and len(problems) < 50:
                problems.append(problem)

    def good_rest() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                try:
                    reply = client.post(url, json=GOOD_JSON)
                except httpx.HTTPError as exc:
                    record("good-rest-transport", f"good REST request: {exc!r}")
                    continue
                if reply.status_code == 200:
                    data = reply.json()["outputs"][0]["data"]
                    record("good-rest-200", None if data == [0, 2] else f"wrong answer {data}")
                elif reply.status_code == 503:
                    record("good-rest-503")
                else:
                    record("good-rest-bad", f"good REST {reply.status_code}: {reply.text[:200]}")

    def hostile_rest() -> None:
        cases = hostile_rest_requests()
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                what, body, headers = random.choice(cases)
                try:
                    reply = client.post(url, content=body, headers=headers)
                except httpx.HTTPError as exc:
                    record("hostile-transport", f"{what}: {exc!r}")
                    continue
                status = reply.status_code
                ok = 400 <= status < 500 or status == 503
                record(f"hostile-{status}", None if ok else f"{what}: {status} {reply.text[:200]}")

    def grpc_traffic() -> None:
        good, garbage = grpc_raw_request(), os.urandom(64)
        with grpc.insecure_channel(server.grpc_address) as channel:
            call = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=None,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            while not stop.is_set():
                hostile = random.random() < 0.3
                try:
                    answer = call(garbage if hostile else good, timeout=30)
                except grpc.RpcError as exc:
                    code = exc.code()
                    if hostile and code == grpc.StatusCode.INVALID_ARGUMENT:
                        record("grpc-hostile-refused")
                    elif not hostile and code == grpc.StatusCode.UNAVAILABLE:
                        record("grpc-good-unavailable")
                    else:
                        record("grpc-bad", f"gRPC hostile={hostile}: {code} {exc.details()}")
                    continue
                if hostile:
                    record("grpc-bad", "garbage bytes were answered OK")
                else:
                    labels = np.frombuffer(answer.raw_output_contents[0], "<i8").tolist()
                    record("grpc-good-ok", None if labels == [0, 2] else f"gRPC answer {labels}")

    def slow_peers() -> None:
        # Connections that send half a request, or nothing, and go away.
        while not stop.is_set():
            port = random.choice([server.http_port, server.grpc_port])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(
                    random.choice(
                        [
                            b"",
                            b"POST /v2/models/iris-logreg/infer HTTP/1.1\r\n",
                            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00",
                        ]
                    )
                )
                stop.wait(0.2)
            record("slow-peer")

    def killer() -> None:
        # A worker killed every 5-10 s: answers in flight there may be 503, never lost.
        while not stop.wait(random.uniform(5, 10)):
            victims = workers_of(server.process.pid)
            if victims:
                os.kill(random.choice(victims).pid, signal.SIGKILL)
                record("worker-killed")

    # Warm up, then take the baseline the soak is measured against.
    with httpx.Client(timeout=30) as client:
        for _ in range(200):
            assert client.post(url, json=GOOD_JSON).status_code == 200
    time.sleep(1)
    baseline = footprint(server.process.pid)
    assert len(tree(server.process.pid)) == 4  # the frontend, the template, two workers
    assert baseline["memfds"] >= 4  # each worker's two rings: the count measures something

    threads = [
        threading.Thread(target=t, daemon=True)
        for t in (
            good_rest,
            good_rest,
            hostile_rest,
            hostile_rest,
            grpc_traffic,
            slow_peers,
            killer,
        )
    ]
    for thread in threads:
        thread.start()
    time.sleep(SOAK_SECONDS)
    stop.set()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a traffic thread hung"

    print(f"soak of {SOAK_SECONDS:.0f} s: {dict(outcomes)}")
    assert not problems, f"{len(problems)} problem(s), first: {problems[:10]}\n{outcomes}"
    assert outcomes["good-rest-200"] > 100, outcomes
    assert outcomes["grpc-good-ok"] > 20, outcomes
    assert sum(v for k, v in outcomes.items() if k.startswith("hostile-4")) > 50, outcomes
    if SOAK_SECONDS >= 30:
        assert outcomes["worker-killed"] >= 2, outcomes

    # Afterwards: ready, right answers, and the footprint back near the baseline.
    server.wait_ready(60)
    wait_for(lambda: len(workers_of(server.process.pid)) == 2, 60, "two workers again")
    with httpx.Client(timeout=30) as client:
        for _ in range(50):
            reply = client.post(url, json=GOOD_JSON)
            assert reply.status_code == 200, reply.text
            assert reply.json()["outputs"][0]["data"] == [0, 2]
    deadline = time.monotonic() + 30
    while True:
        after = footprint(server.process.pid)
        settled = (
            after["rss"] <= baseline["rss"] * 1.10
            and after["fds"] <= baseline["fds"] + 4
            and after["memfds"] <= baseline["memfds"]
        )
        if settled or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert after["rss"] <= baseline["rss"] * 1.10, (baseline, after)
    assert after["fds"] <= baseline["fds"] + 4, (baseline, after)
    assert after["memfds"] <= baseline["memfds"], (baseline, after)
    # Every worker death was one of ours: a hostile request never crashed a worker.
    log = server.output()
    replaced = log.count("; starting a replacement")
    assert 1 <= replaced <= outcomes["worker-killed"], (replaced, outcomes, log[-3000:])
    # Our SIGKILLs are not the model's doing: it is never quarantined for them.
    assert "quarantined" not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
