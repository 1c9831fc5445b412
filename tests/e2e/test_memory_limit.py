"""``--worker-memory-limit`` and a model's ``max_memory`` are enforced in the workers
(docs/operate/memory.md, "Memory limits").

On a real server with two workers and a 256 MiB limit: a model that allocates ten times
the limit (at once, or a MiB at a time, touching it) answers 500 at once, naming the
model and the limit, while another model keeps answering 200 throughout; the worker that
hit the limit is replaced by a fresh one (``inferpool_worker_recycles_total{reason=
"memory_limit"}``) and no worker holds the memory afterwards. A model's ``max_memory``
answers 500 past it without costing its worker. Models of scikit-learn, LightGBM and
XGBoost answer as usual under the limit (it caps the address space, and their thread
pools reserve some).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import httpx
import pytest

from tests.support import Server, build_iris_repository
from tests.support.grpc import infer_request, needs_pool, stub_for
from tests.support.memory import recycles, two_columns, workers_private_mib, write_hog
from tests.support.pool import wait_for
from tests.support.runtimes import (
    lightgbm_estimator,
    rows_request,
    save_booster,
    xgboost_estimator,
)

pytestmark = [pytest.mark.timeout(300), needs_pool]

LIMIT = 256  # MiB
IRIS = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [5, 3, 1, 0]}]}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_iris_repository(tmp_path_factory.mktemp("memory"))
    write_hog(root, "hog")
    write_hog(root, "capped", max_memory=64)
    return root


@pytest.fixture(scope="module")
def server(repository: Path):
    with Server(repository, "--workers", "2", "--worker-memory-limit", str(LIMIT)) as server:
        server.wait_ready(120)
        yield server


class Probe:
    """Asks iris-logreg again and again in a thread, recording each status and latency."""

    def __init__(self, url: str) -> None:
        self.url = f"{url}/v2/models/iris-logreg/infer"
        self.codes: Counter[int] = Counter()
        self.slowest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                self.codes[client.post(self.url, json=IRIS).status_code] += 1
                self.slowest = max(self.slowest, time.monotonic() - started)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def ask(server: Server, model: str, body: dict) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=120)
    return response, time.monotonic() - started


def metrics_url(server: Server) -> str:
    return f"http://127.0.0.1:{server.metrics_port}/metrics"


@pytest.mark.parametrize("how", [0, 1], ids=["at-once", "a-mib-at-a-time"])
def test_an_allocation_past_the_limit_answers_500_naming_it(server: Server, how: int) -> None:
    before = recycles(metrics_url(server)).get("memory_limit", 0)
    with Probe(server.url) as probe:
        time.sleep(0.5)
        response, took = ask(server, "hog", two_columns(10 * LIMIT, how))
        time.sleep(0.5)
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert "model 'hog' ran out of memory" in error, error
    assert f"{LIMIT} MiB (--worker-memory-limit)" in error, error
    # At once: refused before a page is touched; a MiB at a time: up to the limit first.
    assert took < (5 if how == 0 else 30), took
    # The other model kept answering, and quickly, while the hog ran.
    assert set(probe.codes) == {200} and probe.codes[200] > 5, probe.codes
    assert probe.slowest < 5, probe.slowest
    server.expect_lines([r"model 'hog' ran out of memory: its worker may allocate 256 MiB"])
    # The worker that hit it is replaced by a fresh one, and its memory is gone.
    wait_for(
        lambda: recycles(metrics_url(server)).get("memory_limit", 0) == before + 1,
        what="the recycle counted",
    )
    server.expect_lines([r"worker \d recycled \(memory_limit\)"])
    wait_for(lambda: len(workers_private_mib(server.process.pid)) == 2, what="old one exits")
    assert max(workers_private_mib(server.process.pid).values()) < LIMIT / 2
    # The hog itself still serves what fits.
    response, _ = ask(server, "hog", two_columns(16, how))
    assert response.status_code == 200, response.text


def test_over_grpc_the_answer_is_internal_naming_the_limit(server: Server) -> None:
    import numpy as np

    before = recycles(metrics_url(server)).get("memory_limit", 0)
    with stub_for(server) as stub, pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(infer_request("hog", x=np.array([[10.0 * LIMIT, 0]])), timeout=60)
    assert raised.value.code() == grpc.StatusCode.INTERNAL
    details = raised.value.details()
    assert "model 'hog' ran out of memory" in details and f"{LIMIT} MiB" in details, details
    wait_for(
        lambda: recycles(metrics_url(server)).get("memory_limit", 0) == before + 1,
        what="the recycle counted",
    )


def test_max_memory_caps_a_models_calls_without_recycling(server: Server) -> None:
    before = recycles(metrics_url(server))
    response, took = ask(server, "capped", two_columns(100, 0))
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert "model 'capped' ran out of memory: its calls may allocate 64 MiB" in error, error
    assert "max_memory" in error and took < 5
    response, _ = ask(server, "capped", two_columns(32, 1))
    assert response.status_code == 200, response.text
    # A call past its model's cap leaves the worker's limit untouched: nothing to recycle.
    time.sleep(1)
    assert recycles(metrics_url(server)) == before


def test_a_load_past_the_limit_fails_naming_it(server: Server, repository: Path) -> None:
    folder = write_hog(repository, "heavy", parameters={"extra": {"load_mb": 2 * LIMIT}})
    response = httpx.post(f"{server.url}/v2/repository/models/{folder.name}/load", timeout=120)
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert "model 'heavy' ran out of memory while loading" in error, error
    assert f"{LIMIT} MiB (--worker-memory-limit)" in error, error
    # The others kept serving.
    response, _ = ask(server, "iris-logreg", IRIS)
    assert response.status_code == 200, response.text


def test_library_models_work_under_a_small_limit(tmp_path: Path) -> None:
    """One worker (so two threads per native pool, each thread's stack reserved) under a
    64 MiB limit: scikit-learn, LightGBM and XGBoost models, by our kernels and by their
    libraries, answer batches of 512 rows as usual."""
    import numpy as np

    root = build_iris_repository(tmp_path)
    lgb, _ = lightgbm_estimator("classifier")
    save_booster(root / "lgb", lgb.booster_, "model.txt")
    xgb, _ = xgboost_estimator("classifier")
    save_booster(root / "xgb", xgb.get_booster(), "model.json")
    save_booster(
        root / "xgb-dart",
        xgboost_estimator("classifier", booster="dart")[0].get_booster(),
        "model.json",
    )
    rng = np.random.default_rng(0)
    with Server(root, "--workers", "1", "--worker-memory-limit", "64") as server:
        server.wait_ready(120)
        for model in ("iris-logreg", "iris-rf", "lgb", "xgb", "xgb-dart"):
            rows = rng.normal(size=(512, 4 if model.startswith("iris") else 8))
            response, _ = ask(server, model, rows_request(rows))
            assert response.status_code == 200, (model, response.text)
            assert len(response.json()["outputs"][0]["data"]) >= 512
        assert "ran out of memory" not in server.output()


def test_without_workers_nothing_is_limited_or_recycled(tmp_path: Path) -> None:
    """--workers 0: the server process itself is never limited nor recycled; it says so."""
    write_hog(tmp_path, "hog", max_memory=8)
    args = ("--workers", "0", "--worker-memory-limit", "64", "--worker-max-requests", "2")
    with Server(tmp_path, *args) as server:
        server.wait_ready(60)
        for _ in range(4):
            response, _ = ask(server, "hog", two_columns(96, 0))
            assert response.status_code == 200, response.text
        assert "with --workers 0 there is none: nothing is limited or recycled" in (server.output())
        assert "inferpool_worker_recycles_total" not in httpx.get(metrics_url(server)).text
        assert server.stop() == 0
