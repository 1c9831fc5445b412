"""``inferpool.Engine`` serves a repository inside a Python program, async and sync."""

import asyncio

import joblib
import pytest

import inferpool
from inferpool.errors import BadRequest, ModelNotFound
from tests.support import iris_data

REQUEST = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP64",
                       "data": [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]}]}  # fmt: skip


def test_sync_engine_predicts_like_the_estimator(iris_repo):
    estimator = joblib.load(iris_repo / "iris-rf" / "model.joblib")
    X, _ = iris_data()
    with inferpool.Engine(iris_repo) as engine:
        request = {"inputs": [{"name": "x", "shape": [10, 4], "datatype": "FP64",
                               "data": X[:10].tolist()}]}  # fmt: skip
        response = engine.infer_sync("iris-rf", request)
        assert response["outputs"][0]["data"] == estimator.predict(X[:10]).tolist()
        assert {m["name"] for m in engine.models()} == {"iris-logreg", "iris-rf"}
        with pytest.raises(ModelNotFound):
            engine.infer_sync("missing", REQUEST)
        with pytest.raises(BadRequest, match="4 features"):
            bad = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [1, 2]}]}
            engine.infer_sync("iris-rf", bad)


def test_async_engine(iris_repo):
    async def main():
        async with inferpool.Engine(iris_repo) as engine:
            return await engine.infer("iris-logreg", REQUEST)

    response = asyncio.run(main())
    assert response["outputs"][0]["data"] == [0, 2]


def test_engine_refuses_a_repository_with_a_failed_model(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.joblib").write_bytes(b"not a pickle")
    with pytest.raises(RuntimeError, match="broken"), inferpool.Engine(tmp_path):
        pass
