"""Which runtimes the workers share (runtimes/registry.py ``is_fork_safe``): an MLflow pyfunc
of the sklearn flavour and custom runtimes that say ``fork_safe = True`` (an inferpool
Runtime, an MLServer-style MLModel) are loaded by the template and shared copy-on-write, at
start-up and through the API; a custom runtime that does not say so is loaded by each
worker.

One server with two workers for the module; the tests run in order and share its state.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from tests.support import Server, write_custom_model
from tests.support.grpc import needs_pool
from tests.support.pool import template_pid, wait_for

pytestmark = [pytest.mark.timeout(300), needs_pool]

MIB = 1024 * 1024
ARRAY_MB = 40  # what each custom runtime holds: random doubles (no page is all zeros)

HOLDER = """
import numpy as np

from inferpool import Runtime


class Holder(Runtime):
    {marker}

    def load(self):
        self.table = np.random.default_rng(0).random({n})

    def predict(self, payload, outputs):
        return {{outputs[0]: payload.sum(axis=1) + self.table[0]}}
"""
# An MLServer-style model that says it is fork-safe: its load runs in the template.
MLMODEL_HOLDER = """
import numpy as np

from inferpool.mlserver import MLModel
from inferpool.mlserver.types import InferenceResponse, ResponseOutput


class Holder(MLModel):
    fork_safe = True

    async def load(self):
        self.table = np.random.default_rng(1).random({n})
        return True

    async def predict(self, payload):
        output = ResponseOutput(name="y", datatype="FP64", shape=[1], data=[self.table[0]])
        return InferenceResponse(model_name=self.name, outputs=[output])
"""
IO = {
    "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 2]}],
    "outputs": [{"name": "sum", "datatype": "FP64", "shape": [-1]}],
}
SUM_REQUEST = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [1, 2]}]}
FOREST_REQUEST = {
    "inputs": [{"name": "input-0", "shape": [2, 8], "datatype": "FP64", "data": [0.5] * 16}]
}


def write_holder(folder: Path, fork_safe: bool) -> Path:
    marker = "fork_safe = True" if fork_safe else "accepts = 'array'"
    source = HOLDER.format(marker=marker, n=ARRAY_MB * MIB // 8)
    return write_custom_model(folder, source, "Holder", **IO)


def write_mlflow_forest(folder: Path, seed: int) -> None:
    """An MLflow sklearn-flavour forest of about 30 MB (deep trees of 16 classes)."""
    import mlflow.sklearn
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(seed)
    X = rng.random((6000, 8))
    forest = RandomForestClassifier(28, random_state=seed, n_jobs=1)
    forest.fit(X, rng.integers(0, 16, len(X)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLflow's advice on pickles and signatures
        mlflow.sklearn.save_model(
            forest,
            str(folder),
            pip_requirements=[],
            serialization_format=mlflow.sklearn.SERIALIZATION_FORMAT_CLOUDPICKLE,
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    root = tmp_path_factory.mktemp("shared")
    write_mlflow_forest(root / "forest", 0)
    write_holder(root / "shared", fork_safe=True)
    write_holder(root / "own", fork_safe=False)
    write_custom_model(root / "mlmodel", MLMODEL_HOLDER.format(n=ARRAY_MB * MIB // 8), "Holder")
    with Server(root, "--workers", "2") as server:
        server.wait_ready(timeout=120)
        yield server, root


def infer(server: Server, name: str, body: dict) -> None:
    response = httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text


def size_mib(server: Server, name: str) -> float:
    """The model's footprint as placement logged it (the last load's)."""
    output = server.expect_lines([rf"model '{name}': .*, [\d.]+ MiB each"], timeout=60)
    return float(output.split(f"model '{name}': ")[-1].split(" MiB each")[0].split(", ")[-1])


def workers_uss(server: Server) -> dict[int, float]:
    """Each worker's private memory (USS) in MiB, by pid, once every model answered in it."""
    for _ in range(4):  # each worker serves some of them (least-loaded worker first)
        infer(server, "forest", FOREST_REQUEST)
        infer(server, "shared", SUM_REQUEST)
        infer(server, "own", SUM_REQUEST)
        infer(server, "mlmodel", SUM_REQUEST)
    template = psutil.Process(template_pid(server.process.pid))
    return {w.pid: w.memory_full_info().uss / MIB for w in template.children()}


def test_shared_runtimes_cost_a_worker_little_and_an_unshared_one_its_size(served) -> None:
    server, _ = served
    forest = size_mib(server, "forest")
    assert forest >= 20  # the trees' arrays, shared
    uss = workers_uss(server)
    assert len(uss) == 2
    for private in uss.values():
        # Its own copy of the unshared model; of the three shared ones, no more than half.
        assert ARRAY_MB * 0.9 < private < ARRAY_MB + (2 * ARRAY_MB + forest) / 2, uss


def test_models_loaded_through_the_api_are_shared_too(served) -> None:
    server, root = served
    before = workers_uss(server)
    write_mlflow_forest(root / "forest2", 1)
    write_holder(root / "shared2", fork_safe=True)
    for name in ("forest2", "shared2"):
        response = httpx.post(f"{server.url}/v2/repository/models/{name}/load", timeout=120)
        assert response.status_code == 200, response.text
    infer(server, "forest2", FOREST_REQUEST)
    infer(server, "shared2", SUM_REQUEST)
    added = size_mib(server, "forest2") + ARRAY_MB
    wait_for(lambda: not set(before) & set(workers_uss(server)), 60, "a new generation")
    after = workers_uss(server)
    assert len(after) == 2
    # The new generation shares the template's copies of the two new models.
    assert max(after.values()) < max(before.values()) + added / 2, (before, after)
