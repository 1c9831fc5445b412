"""The template loads every library single-threaded, and each worker sizes its own pools.

With fewer workers than cores each worker gets several native threads. Had the template
the same count, loading a scikit-learn forest there (which brings SciPy's OpenBLAS in)
would start OpenBLAS's threads in it: the model would not be shared and the template
would restart. The workers must still run with their own count.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from sklearn.ensemble import RandomForestClassifier

from tests.support import Server, iris_data, write_custom_model, write_sklearn_model
from tests.support.grpc import needs_pool

pytestmark = [pytest.mark.timeout(180), needs_pool]

THREADS = os.cpu_count() or 1  # one worker: every core

# Reports, from inside a worker, the size of its loaded OpenBLAS pools and the environment
# libraries loaded from now on would read.
POOLS_RUNTIME = """
import os

import numpy as np
from threadpoolctl import threadpool_info

from inferpool import Runtime


class PoolsRuntime(Runtime):
    def load(self):
        import scipy.linalg  # noqa: F401  (its OpenBLAS, as scikit-learn's imports load it)

    def predict(self, payload, outputs):
        blas = [i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"]
        return {"pools": np.array([min(blas), max(blas), int(os.environ["OMP_NUM_THREADS"])])}
"""


def test_a_forest_loaded_after_start_up_is_shared_and_the_worker_keeps_its_threads(
    tmp_path: Path,
) -> None:
    io = {
        "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 1]}],
        "outputs": [{"name": "pools", "datatype": "INT64", "shape": [3]}],
    }
    write_custom_model(tmp_path / "pools", POOLS_RUNTIME, "PoolsRuntime", **io)
    with Server(tmp_path, "--workers", "1") as server:
        server.wait_ready(120)
        X, y = iris_data()
        forest = RandomForestClassifier(n_estimators=10, random_state=0).fit(X, y)
        write_sklearn_model(tmp_path / "forest", forest)
        url = f"{server.url}/v2/repository/models/forest/load"
        assert httpx.post(url, timeout=120).status_code == 200
        server.expect_lines([r"a new generation of workers took over"])
        assert "is not shared between workers" not in server.output()
        assert "worker template process restarted" not in server.output()

        body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP64", "data": [0]}]}
        reply = httpx.post(f"{server.url}/v2/models/pools/infer", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == [THREADS, THREADS, THREADS]
