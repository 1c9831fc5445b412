"""Workers share the models the template loaded before forking (copy-on-write)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np
import pytest
from sklearn.neighbors import KNeighborsClassifier

from tests.support import Server, write_sklearn_model
from tests.support.pool import wait_for

pytestmark = pytest.mark.timeout(300)


def knn(seed: int) -> tuple[KNeighborsClassifier, np.ndarray]:
    """A classifier that keeps its 40 MB of training data, and rows to ask it about."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(100_000, 50))
    model = KNeighborsClassifier(n_neighbors=3, algorithm="brute").fit(
        X, rng.integers(0, 5, 100_000)
    )
    return model, X[:5]


def sizes(server: Server) -> list[float]:
    return [
        float(size) for size in re.findall(r"model 'knn': .*, ([\d.]+) MiB each", server.output())
    ]


def ask(server: Server, rows: np.ndarray) -> list[int]:
    body = {"inputs": [{"name": "x", "shape": list(rows.shape), "datatype": "FP64",
                        "data": rows.ravel().tolist()}]}  # fmt: skip
    response = httpx.post(f"{server.url}/v2/models/knn/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


def test_preloaded_model_is_shared_and_a_changed_one_is_loaded_afresh(tmp_path: Path) -> None:
    first, rows = knn(0)
    write_sklearn_model(tmp_path / "knn", first)
    with Server(tmp_path, "--workers", "2") as server:
        server.wait_ready()
        [shared] = sizes(server)
        assert shared < 10  # 40 MB of training data, not copied into either worker
        assert ask(server, rows) == first.predict(rows).tolist()

        second, other_rows = knn(1)
        write_sklearn_model(tmp_path / "knn", second)  # the template's copy is now stale
        response = httpx.post(f"{server.url}/v2/repository/models/knn/load", timeout=120)
        assert response.status_code == 200, response.text
        wait_for(lambda: len(sizes(server)) == 2, what="the reload logged")
        assert sizes(server)[1] >= 30  # loaded by each worker itself
        assert ask(server, other_rows) == second.predict(other_rows).tolist()
        assert server.stop() == 0
