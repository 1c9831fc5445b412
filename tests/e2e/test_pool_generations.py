"""Models loaded after start-up are shared copy-on-write: the template loads them and a new
generation of workers takes over (engine/pool/generations.py).

One server with two workers for the module; the tests run in order and share its state:
a 40 MB model loaded through the API, reloaded under load, unloaded; a roll that fails; a
runtime that starts a thread in the template.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier

from tests.support import Server, iris_data, write_custom_model, write_sklearn_model
from tests.support.grpc import needs_pool
from tests.support.pool import (
    ask_model,
    big_knn,
    live_workers,
    logged_sizes,
    process_exists,
    template_pid,
    wait_for,
)

pytestmark = [pytest.mark.timeout(300), needs_pool]

MIB = 1024 * 1024
MODEL_MB = 40  # the training data the classifier keeps: 100,000 rows of 50 doubles


@pytest.fixture(scope="module")
def knn() -> tuple[KNeighborsClassifier, np.ndarray]:
    return big_knn(0)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    root = tmp_path_factory.mktemp("repository")
    X, y = iris_data()
    write_sklearn_model(root / "iris", LogisticRegression(max_iter=500).fit(X, y))
    with Server(root, "--workers", "2") as server:
        server.wait_ready(120)
        yield server, root


def current_template(server: Server) -> int | None:
    try:
        return template_pid(server.process.pid)
    except AssertionError:  # restarting
        return None


def workers(server: Server) -> list[psutil.Process]:
    return psutil.Process(template_pid(server.process.pid)).children()


def total_pss(server: Server) -> int:
    template = psutil.Process(template_pid(server.process.pid))
    return sum(p.memory_full_info().pss for p in [template, *template.children()])


def load(server: Server, name: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/repository/models/{name}/load", timeout=120)


def test_a_model_loaded_through_the_api_is_shared_by_a_new_generation(served, knn) -> None:
    server, root = served
    model, rows = knn
    old = live_workers(server)
    before = max(worker.memory_full_info().uss for worker in workers(server))
    write_sklearn_model(root / "knn", model)
    response = load(server, "knn")
    assert response.status_code == 200, response.text
    assert ask_model(server, "knn", rows) == model.predict(rows).tolist()
    wait_for(lambda: not any(process_exists(pid) for pid in old), 30, "the old workers exit")
    assert live_workers(server).isdisjoint(old)
    with ThreadPoolExecutor(4) as pool:  # at once, so that both workers serve it
        list(pool.map(lambda _: ask_model(server, "knn", rows), range(8)))
    for worker in workers(server):
        # Loaded by each worker, the model would cost its 40 MB in each.
        grown = worker.memory_full_info().uss - before
        assert grown < MODEL_MB * MIB / 4, f"pid {worker.pid} grew by {grown / MIB:.1f} MiB"
    assert "a new generation of workers took over" in server.output()


def restarts(server: Server) -> list[float]:
    metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    return [
        float(v)
        for v in re.findall(r"^inferpool_worker_restarts_total\{.*\} (\S+)$", metrics, re.M)
    ]


def test_a_roll_is_no_restart_and_a_replacement_takes_the_templates_copy(served, knn) -> None:
    server, _ = served
    _, rows = knn
    assert restarts(server) == [0.0, 0.0]  # the new generation replaced no dead worker
    victim = workers(server)[0]
    before = {w.pid for w in workers(server)}
    victim.kill()
    wait_for(lambda: len(set(w.pid for w in workers(server)) - before) == 1, 30, "a replacement")
    wait_for(lambda: sum(restarts(server)) == 1, 30, "the restart counted")
    for _ in range(4):
        ask_model(server, "knn", rows)
    [replacement] = [w for w in workers(server) if w.pid not in before]
    grown = replacement.memory_full_info().uss
    assert grown < MODEL_MB * MIB / 2, f"the replacement holds {grown / MIB:.1f} MiB of its own"


def test_a_reload_under_load_answers_every_request(served, knn) -> None:
    server, root = served
    _, rows = knn
    old = live_workers(server)
    body = {"inputs": [{"name": "x", "shape": list(rows.shape), "datatype": "FP64",
                        "data": rows.ravel().tolist()}]}  # fmt: skip
    later = time.time() + 5
    os.utime(root / "knn" / "model.joblib", (later, later))  # the files changed: a roll

    async def run() -> tuple[Counter, int]:
        outcomes: Counter = Counter()
        done = asyncio.Event()
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:

            async def send() -> None:
                while not done.is_set():
                    reply = await client.post("/v2/models/knn/infer", json=body)
                    outcomes[reply.status_code if reply.status_code == 200 else reply.text] += 1

            async def reload() -> int:
                await asyncio.sleep(0.3)
                reply = await client.post("/v2/repository/models/knn/load", timeout=120)
                await asyncio.sleep(0.5)  # the old generation drains meanwhile
                done.set()
                return reply.status_code

            status, *_ = await asyncio.gather(reload(), *(send() for _ in range(16)))
        return outcomes, status

    outcomes, status = asyncio.run(run())
    assert status == 200
    assert set(outcomes) == {200}, outcomes
    wait_for(lambda: not any(process_exists(pid) for pid in old), 30, "the old workers exit")


def test_the_size_placement_uses_is_the_same_on_every_load(served) -> None:
    server, root = served
    for step in range(3):
        later = time.time() + 10 + step
        os.utime(root / "knn" / "model.joblib", (later, later))
        assert load(server, "knn").status_code == 200
    wait_for(lambda: len(logged_sizes(server, "knn")) >= 5, 10, "five loads logged")
    assert len(set(logged_sizes(server, "knn"))) == 1, logged_sizes(server, "knn")
    assert logged_sizes(server, "knn")[0] >= MODEL_MB * 0.9  # the objects' size, not an RSS delta


def test_an_unload_gives_the_memory_back_template_included(served) -> None:
    server, _ = served
    time.sleep(1)  # the last old generation has exited (its copy went with it)
    loaded = total_pss(server)
    response = httpx.post(f"{server.url}/v2/repository/models/knn/unload", timeout=60)
    assert response.status_code == 200, response.text
    wait_for(
        lambda: total_pss(server) < loaded - MODEL_MB * MIB * 3 / 4, 20, "the memory comes back"
    )


def test_a_forest_costs_one_copy_and_its_unload_gives_it_back(served) -> None:
    """A forest is thousands of mid-sized arrays on the heap (the KNN above is one big
    mapping). Loading it frees about as much again: the template hands that back before
    forking, and the workers hand the unloaded model's pages back."""
    server, root = served
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(20_000, 10)), rng.integers(0, 4, size=20_000)
    forest = RandomForestClassifier(n_estimators=16, random_state=0, n_jobs=2).fit(X, y)
    write_sklearn_model(root / "forest", forest)
    old = live_workers(server)
    before = total_pss(server)
    assert load(server, "forest").status_code == 200
    wait_for(lambda: not any(process_exists(pid) for pid in old), 30, "the old workers exit")
    ask_model(server, "forest", X[:8])
    ask_model(server, "forest", X[:8])
    [size] = logged_sizes(server, "forest")
    assert size > 20  # MiB: enough to show
    grown = (total_pss(server) - before) / MIB
    # Kept by the template, the loader's garbage would double it (in every worker forked).
    assert grown < 1.75 * size, f"template and workers grew by {grown:.0f} MiB, copy {size}"
    loaded = total_pss(server)
    response = httpx.post(f"{server.url}/v2/repository/models/forest/unload", timeout=60)
    assert response.status_code == 200, response.text
    wait_for(lambda: total_pss(server) < loaded - size * MIB * 3 / 4, 20, "the memory comes back")


# A runtime the template may not load (not fork-safe): each worker loads it, and it fails
# to load while its folder holds a file named "broken".
PICKY_RUNTIME = """
from pathlib import Path

from inferpool import Runtime


class PickyRuntime(Runtime):
    def load(self):
        if (Path(__file__).parent / "broken").exists():
            raise RuntimeError("this worker cannot load me")

    def predict(self, payload, outputs):
        return {outputs[0]: payload.sum(axis=1)}
"""
SUM_IO = {
    "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 3]}],
    "outputs": [{"name": "sum", "datatype": "FP64", "shape": [-1]}],
}
SUM_REQUEST = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, 3]}]}


def test_a_roll_that_fails_leaves_the_old_generation_serving(served) -> None:
    server, root = served
    write_custom_model(root / "picky", PICKY_RUNTIME, "PickyRuntime", **SUM_IO)
    assert load(server, "picky").status_code == 200
    (root / "picky" / "broken").touch()
    X, y = iris_data()
    write_sklearn_model(root / "fresh", LogisticRegression(max_iter=300).fit(X, y))
    old = live_workers(server)
    response = load(server, "fresh")
    assert response.status_code == 500
    assert "model 'picky'" in response.text and "cannot load me" in response.text
    # The old generation still serves; the new one is gone.
    wait_for(lambda: {w.pid for w in workers(server)} == old, 10, "the new workers closed")
    picky = httpx.post(f"{server.url}/v2/models/picky/infer", json=SUM_REQUEST, timeout=30)
    assert picky.status_code == 200, picky.text
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200

    (root / "picky" / "broken").unlink()
    response = load(server, "fresh")
    assert response.status_code == 200, response.text
    wait_for(lambda: old.isdisjoint(w.pid for w in workers(server)), 30, "a new generation")


# A runtime that says it is fork-safe but starts a thread when it loads.
THREADED_RUNTIME = """
import threading
import time

from inferpool import Runtime


class ThreadedRuntime(Runtime):
    fork_safe = True

    def load(self):
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()

    def predict(self, payload, outputs):
        return {outputs[0]: payload.sum(axis=1)}
"""


def test_a_runtime_that_starts_a_thread_in_the_template_is_loaded_by_each_worker(
    served,
) -> None:
    server, root = served
    template = template_pid(server.process.pid)
    write_custom_model(root / "threaded", THREADED_RUNTIME, "ThreadedRuntime", **SUM_IO)
    response = load(server, "threaded")
    assert response.status_code == 200, response.text
    reply = httpx.post(f"{server.url}/v2/models/threaded/infer", json=SUM_REQUEST, timeout=30)
    assert reply.status_code == 200, reply.text
    server.expect_lines([r"model 'threaded' is not shared between workers: loading it started"])
    wait_for(lambda: current_template(server) not in (None, template), 30, "a new template")
    # Never asked of the template again: a reload is loaded by each worker.
    assert load(server, "threaded").status_code == 200
    assert server.output().count("model 'threaded' is not shared") == 1


@pytest.mark.slow
def test_a_runtime_that_starts_a_thread_at_start_up_is_loaded_by_each_worker(
    tmp_path: Path,
) -> None:
    write_custom_model(tmp_path / "threaded", THREADED_RUNTIME, "ThreadedRuntime", **SUM_IO)
    X, y = iris_data()
    write_sklearn_model(tmp_path / "iris", LogisticRegression(max_iter=500).fit(X, y))
    with Server(tmp_path, "--workers", "2") as server:
        server.wait_ready(120)  # the workers wait for the restarted template
        reply = httpx.post(f"{server.url}/v2/models/threaded/infer", json=SUM_REQUEST, timeout=30)
        assert reply.status_code == 200, reply.text
        server.expect_lines([r"model 'threaded' is not shared between workers"])
        # The restarted template preloaded the rest of the repository: no roll was needed.
        assert "a new generation of workers took over" not in server.output()
