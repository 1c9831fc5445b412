"""Warm-up samples on a real server, in-process and with two workers: each replica runs
them through the worker path before its model is READY, the load log has one line per
replica with its timings, and a failing sample fails the load (a reload's failure leaves
the previous version serving)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sklearn.linear_model import LogisticRegression

from tests.support import Server, iris_data, write_sklearn_model
from tests.support.grpc import WORKER_COUNTS
from tests.support.pool import calls, sum_request, worker_pids, write_counting_model

# Three rows of zeros (batch_size 4) three times, then the request file twice: 5 calls.
COUNTER_WARMUP = [
    {"name": "zeros", "count": 3, "batch_size": 4},
    {"name": "file", "count": 2, "request_file": "warmup/two-rows.json"},
]
TIMINGS = r"in [\d.]+ ms \(first [\d.]+ ms, slowest [\d.]+ ms, median [\d.]+ ms\)"


def write_iris(root: Path, name: str, **settings: Any) -> None:
    X, y = iris_data()
    folder = write_sklearn_model(root / name, LogisticRegression(max_iter=1000).fit(X, y))
    (folder / "model-settings.json").write_text(json.dumps({"name": name, **settings}))


@dataclass
class Served:
    server: Server
    workers: int
    root: Path  # the calls files; the repository is its "models"

    @property
    def repository(self) -> Path:
        return self.root / "models"

    @property
    def replicas(self) -> int:
        return max(1, self.workers)

    @property
    def where(self) -> str:
        """Where a replica's warm-up line says it ran."""
        return r"in worker (\d)" if self.workers else "in the server process"


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda workers: f"w{workers}")
def served(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Served]:
    workers = request.param
    root = tmp_path_factory.mktemp(f"warmup-w{workers}")
    repository = root / "models"
    folder = write_counting_model(
        repository, "counter", root / "counter.calls", warmup=COUNTER_WARMUP
    )
    (folder / "warmup").mkdir()
    rows = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    (folder / "warmup" / "two-rows.json").write_text(json.dumps(sum_request(rows, "w")))
    write_counting_model(repository, "steady", root / "steady.calls")
    # scikit-learn, warmed with zeros of its declared input.
    declared = [{"name": "input-0", "datatype": "FP64", "shape": [-1, 4]}]
    warmup = [{"name": "zeros", "count": 2, "batch_size": 8}]
    write_iris(repository, "iris-warm", inputs=declared, warmup=warmup)
    with Server(repository, "--workers", str(workers)) as server:
        server.wait_ready(120)
        yield Served(server, workers, root)


def index(server: Server) -> dict[str, dict[str, Any]]:
    reply = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10)
    assert reply.status_code == 200, reply.text
    return {entry["name"]: entry for entry in reply.json()}


def test_each_replica_runs_every_sample_and_logs_one_line(served: Served) -> None:
    server = served.server
    made = calls(served.root / "counter.calls")
    per_replica = Counter(pid for pid, _ in made)
    assert len(per_replica) == served.replicas
    # In the workers (or the server process), never in the template.
    assert set(per_replica) == set(worker_pids(server).values()) or {server.process.pid}
    for pid in per_replica:  # the zeros (4 rows) three times, then the file (2 rows) twice
        assert [rows for p, rows in made if p == pid] == [4, 4, 4, 2, 2]
    line = rf"model 'counter': warm-up {served.where}: 2 samples, 5 requests {TIMINGS}"
    found = re.findall(line, server.expect_lines([line]))
    assert len(found) == served.replicas
    if served.workers:
        assert sorted(found) == [str(slot) for slot in range(served.workers)]
    # Warm-up requests are not clients' requests: the statistics count none.
    stats = httpx.get(f"{server.url}/v2/models/counter/stats", timeout=10).json()
    assert stats["model_stats"][0]["inference_count"] == 0


def test_a_scikit_learn_model_is_warmed_with_its_declared_inputs(served: Served) -> None:
    server = served.server
    line = rf"model 'iris-warm': warm-up {served.where}: 1 samples, 2 requests {TIMINGS}"
    assert len(re.findall(line, server.expect_lines([line]))) == served.replicas
    rows = {"inputs": [{"name": "input-0", "datatype": "FP64", "shape": [1, 4], "data": [0] * 4}]}
    reply = httpx.post(f"{server.url}/v2/models/iris-warm/infer", json=rows, timeout=10)
    assert reply.status_code == 200, reply.text


def test_a_model_is_ready_only_after_every_replica_warmed_up(served: Served) -> None:
    server = served.server
    calls_file = served.root / "late.calls"
    # Four calls of 0.1 s each per replica: a window the index is read in many times.
    write_counting_model(
        served.repository, "late", calls_file, delay=0.1, warmup=[{"name": "slow", "count": 4}]
    )
    answers: list[httpx.Response] = []
    loading = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{server.url}/v2/repository/models/late/load", timeout=60)
        )
    )
    loading.start()
    seen: list[tuple[str, int]] = []
    while loading.is_alive():
        state = index(server).get("late", {}).get("state", "")
        seen.append((state, len(calls(calls_file))))  # the index first, then the calls
        time.sleep(0.01)
    loading.join()
    assert answers[0].status_code == 200, answers[0].text
    assert index(server)["late"]["state"] == "READY"
    expected = 4 * served.replicas
    assert all(count >= expected for state, count in seen if state == "READY"), seen
    assert any(count < expected for state, count in seen if state != "READY"), seen
    assert set(Counter(pid for pid, _ in calls(calls_file)).values()) == {4}


def test_a_failing_sample_fails_the_load_with_its_reason(served: Served) -> None:
    server = served.server
    wide = [{"name": "input-0", "datatype": "FP64", "shape": [1, 5], "data": [1, 2, 3, 4, 5]}]
    write_iris(served.repository, "iris-wide", warmup=[{"name": "wide", "inputs": wide}])
    reply = httpx.post(f"{server.url}/v2/repository/models/iris-wide/load", timeout=60)
    assert reply.status_code >= 400
    reason = "warm-up 'wide' failed: model 'iris-wide' rejected input 'input-0': "
    assert reason in reply.json()["error"] and "got 5" in reply.json()["error"]
    entry = index(server)["iris-wide"]
    assert entry["state"] == "FAILED" and reason in entry["reason"]
    ready = httpx.get(f"{server.url}/v2/models/iris-wide/ready", timeout=10)
    assert ready.status_code != 200


def test_a_reload_that_fails_its_warm_up_leaves_the_previous_version_serving(
    served: Served,
) -> None:
    server = served.server
    folder = served.repository / "steady"
    settings_file = folder / "model-settings.json"
    document = json.loads(settings_file.read_text())
    # A request file whose shape claims three values but carries two.
    lying = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 3], "data": [1, 2]}]}
    (folder / "lying.json").write_text(json.dumps(lying))
    document["warmup"] = [{"name": "lying", "request_file": "lying.json"}]
    settings_file.write_text(json.dumps(document))
    reply = httpx.post(f"{server.url}/v2/repository/models/steady/load", timeout=60)
    assert reply.status_code >= 400
    assert "warm-up 'lying' failed: " in reply.json()["error"]
    entry = index(server)["steady"]
    assert entry["state"] == "READY"
    assert entry["reason"].startswith("reload failed: ")
    assert "warm-up 'lying' failed: " in entry["reason"]
    infer = httpx.post(
        f"{server.url}/v2/models/steady/infer", json=sum_request([[1, 2, 3]], "r"), timeout=10
    )
    assert infer.status_code == 200, infer.text
    assert infer.json()["outputs"][0]["data"] == [6.0]
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
