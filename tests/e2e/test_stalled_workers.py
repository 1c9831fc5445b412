"""A hung or slow model cannot starve the others (issue 37, point 2; engine/pool/stalls.py).

Two calls to a model whose predict sleeps for an hour take both workers of a two-worker
pool; probes ask an unrelated model without pause over REST and gRPC all along. The
workers are found stalled after ``--stall-threshold``, a standby worker serves the other
model, the hung calls are answered 504 / DEADLINE_EXCEEDED at the model's timeout (their
workers killed and replaced), and the standby worker retires: the pool is back to its
size and memory came back.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from tests.support import Server, build_iris_repository
from tests.support.grpc import infer_request, stub_for
from tests.support.pool import sum_request, wait_for, write_counting_model
from tests.support.stalls import IRIS_ROW, Probe, metric, tree_memory

pytestmark = pytest.mark.timeout(240)

MODEL_TIMEOUT = 8.0
THRESHOLD = 1.0


def _repository(root: Path) -> Path:
    build_iris_repository(root)
    write_counting_model(root, "hung", root / "calls.txt", delay=3600, timeout=MODEL_TIMEOUT)
    return root


def _hung_rest(server: Server, results: dict[str, tuple[float, int, str]]) -> None:
    started = time.monotonic()
    reply = httpx.post(f"{server.url}/v2/models/hung/infer", json=sum_request([[1, 2, 3]], "h"),
                       timeout=60)  # fmt: skip
    results["rest"] = (time.monotonic() - started, reply.status_code, reply.text)


def _hung_grpc(server: Server, results: dict[str, tuple[float, int, str]]) -> None:
    request = infer_request("hung", x=np.array([[1.0, 2.0, 3.0]]))
    started = time.monotonic()
    with stub_for(server) as stub:
        try:
            stub.ModelInfer(request, timeout=60)
            code, details = "OK", ""
        except grpc.RpcError as exc:
            code, details = exc.code().name, exc.details()
    results["grpc"] = (time.monotonic() - started, code, details)


def _probe_two_hung_calls(server: Server) -> tuple[list[Probe], list[threading.Thread], dict]:
    """Probes of ``iris-logreg`` over REST and gRPC, then (a second later) one hung call
    over each; the probes, the hung calls' threads, and where their answers go."""
    probes = [Probe(server, "iris-logreg", protocol).start() for protocol in ("rest", "grpc")]
    time.sleep(1)
    results: dict[str, tuple[float, int, str]] = {}
    hung = [threading.Thread(target=_hung_rest, args=(server, results)),
            threading.Thread(target=_hung_grpc, args=(server, results))]  # fmt: skip
    for thread in hung:
        thread.start()
    return probes, hung, results


def _check(probes: list[Probe], results: dict, slowest: float) -> None:
    """Each hung call answered 504 / DEADLINE_EXCEEDED at its timeout; every probe's
    answer a 200 / OK, p99 under 2 s and none slower than ``slowest``."""
    seconds, status, text = results["rest"]
    assert status == 504, text
    assert "ran longer than its timeout (8 s)" in text
    assert MODEL_TIMEOUT - 0.5 < seconds < MODEL_TIMEOUT + 5
    seconds, code, details = results["grpc"]
    assert code == "DEADLINE_EXCEEDED", details
    assert MODEL_TIMEOUT - 0.5 < seconds < MODEL_TIMEOUT + 5
    for probe in probes:
        assert probe.statuses() == {"200" if probe.protocol == "rest" else "OK"}
        assert len(probe.answers) > 50, probe.protocol
        assert probe.p99() < 2.0, (probe.protocol, probe.p99())
        assert probe.slowest() < slowest, (probe.protocol, probe.slowest())


def _ask_iris(server: Server) -> int:
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": IRIS_ROW}]}
    url = f"{server.url}/v2/models/iris-logreg/infer"
    return httpx.post(url, json=body, timeout=30).status_code


def test_hung_calls_do_not_starve_another_model(tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    args = ("--workers", "2", "--stall-threshold", str(THRESHOLD))
    with Server(repository, *args) as server:
        server.wait_ready()
        for _ in range(20):  # every worker warm, as in service
            assert _ask_iris(server) == 200
        processes, memory = tree_memory(server.process.pid)
        assert processes == 4  # the server, the template, two workers
        probes, hung, results = _probe_two_hung_calls(server)
        # A standby worker runs while both workers are stalled.
        wait_for(lambda: tree_memory(server.process.pid)[0] == 5, 10, "a standby worker")
        for thread in hung:
            thread.join(60)
        time.sleep(1)  # the probes go on past the timeouts, through the replacements
        for probe in probes:
            probe.stop()

        # A request sent before the workers were found stalled waits for the standby
        # worker: the threshold and a fork, no more.
        _check(probes, results, slowest=THRESHOLD + 4)

        # Back to its size: two workers (replacements), the standby worker retired.
        wait_for(lambda: tree_memory(server.process.pid)[0] == 4, 20, "the pool's size")
        page = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
        assert metric(page, "inferpool_worker_timeout_kills_total") == 2
        assert metric(page, "inferpool_worker_stalls_total") >= 2
        assert metric(page, "inferpool_standby_workers_started_total") >= 1
        # The probes' requests queued behind the hung calls before they counted as stalled.
        assert metric(page, "inferpool_stalled_requests_moved_total") >= 1
        assert metric(page, "inferpool_standby_workers") == 0
        server.wait_ready(10)
        after = tree_memory(server.process.pid)[1]
        assert after < memory + 30 * 2**20, (memory / 2**20, after / 2**20)
        log = server.output()
        assert "has run one call of model 'hung'" in log
        assert "standby worker" in log and "retires" in log


def test_hung_calls_in_process_leave_the_loop_serving(tmp_path: Path) -> None:
    """``--workers 0``: predicts run in 1 + --max-standby-workers threads off the loop; two
    hung calls hold two of the three, the third serves the other model, and the hung
    calls are answered at the model's timeout (their threads stay held: a thread cannot
    be killed). The server still stops at once."""
    repository = _repository(tmp_path)
    with Server(repository, "--workers", "0") as server:
        server.wait_ready()
        probes, hung, results = _probe_two_hung_calls(server)
        for thread in hung:
            thread.join(60)
        for probe in probes:
            probe.stop()
        _check(probes, results, slowest=2.0)  # a free thread all along
        assert "holds one of the 3 predict threads" in results["rest"][2]
        started = time.monotonic()
        assert server.stop() == 0
        assert time.monotonic() - started < 20


def test_the_standby_bound_holds_when_standby_workers_stall_too(tmp_path: Path) -> None:
    """``--max-standby-workers 1``: model ``hung`` stalls both workers, the standby worker
    serves the others, then model ``hung2`` stalls the standby worker: no second one is
    forked (the log says so); the other model's requests wait behind a stalled worker,
    and every hung call is answered 504 at its timeout; the pool comes back to its size."""
    repository = _repository(tmp_path)
    write_counting_model(repository, "hung2", tmp_path / "calls2.txt", delay=3600,
                         timeout=MODEL_TIMEOUT)  # fmt: skip
    args = ("--workers", "2", "--stall-threshold", str(THRESHOLD), "--max-standby-workers", "1")
    with Server(repository, *args) as server:
        server.wait_ready()
        replies: list[int] = []

        def ask(model: str) -> None:
            url = f"{server.url}/v2/models/{model}/infer"
            reply = httpx.post(url, json=sum_request([[1, 2, 3]], model), timeout=60)
            replies.append(reply.status_code)

        hung = [threading.Thread(target=ask, args=("hung",)) for _ in range(2)]
        for thread in hung:
            thread.start()
        wait_for(lambda: tree_memory(server.process.pid)[0] == 5, 10, "a standby worker")
        server.expect_lines([r"standby worker 0 \(pid \d+\) started .* it serves .*'hung2'"])
        hung.append(threading.Thread(target=ask, args=("hung2",)))
        hung[-1].start()
        server.expect_lines([
            r"standby worker 0 \(pid \d+\) has run one call of model 'hung2'",
            r"has no ready replica and 1 standby worker\(s\) run already "
            r"\(--max-standby-workers\): its requests wait behind the stalled workers",
        ])  # fmt: skip
        assert tree_memory(server.process.pid)[0] == 5  # no second standby worker
        for thread in hung:
            thread.join(60)
        assert replies == [504, 504, 504]
        wait_for(lambda: tree_memory(server.process.pid)[0] == 4, 20, "the pool's size")
        assert _ask_iris(server) == 200
