"""``inferpool.Engine(repo, workers=2)``: the embedded API over the same worker pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import joblib
import numpy as np
import pytest

from inferpool import Engine
from tests.support import build_iris_repository, iris_data

pytestmark = pytest.mark.timeout(180)


def request_for(rows: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(rows.shape), "datatype": "FP64",
                        "data": rows.ravel().tolist()}]}  # fmt: skip


def test_engine_with_workers_sync_and_async(tmp_path: Path) -> None:
    repo = build_iris_repository(tmp_path)
    X, _ = iris_data()
    expected = joblib.load(repo / "iris-rf" / "model.joblib").predict(X[:10]).tolist()
    with Engine(repo, workers=2) as engine:
        client = engine.client
        assert type(client).__name__ == "PoolClient"
        assert len([w for w in client.workers if w.alive]) == 2
        answer = engine.infer_sync("iris-rf", request_for(X[:10]))
        assert answer["outputs"][0]["data"] == expected
        zygote = client._zygote
    assert zygote.poll() is not None  # the template (and so every worker) is gone
    assert all(not w.alive for w in client.workers)

    async def use_async() -> list[dict]:
        async with Engine(repo, workers=2) as engine:
            return await asyncio.gather(
                *(engine.infer("iris-rf", request_for(X[i : i + 10])) for i in (0, 0, 0))
            )

    for answer in asyncio.run(use_async()):
        assert answer["outputs"][0]["data"] == expected
