"""``inferpool.Engine`` in this process (``workers=0``): inputs and results as Python
values, the one start-up, and the raw gRPC wire it uses to reach workers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import joblib
import numpy as np
import pytest

import inferpool
from inferpool.engine.client import StartupFailed
from inferpool.engine.embedded_io import build_request
from inferpool.errors import BadRequest, Forbidden, ModelNotFound
from inferpool.protocol import grpc_wire
from inferpool.protocol.grpc_raw import from_wire, to_wire
from inferpool.protocol.types import InferenceResponse, Tensor
from tests.support import iris_data

ROWS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]])


def test_arrays_in_and_out_like_the_estimator(iris_repo: Path) -> None:
    estimator = joblib.load(iris_repo / "iris-rf" / "model.joblib")
    X, _ = iris_data()
    with inferpool.Engine(iris_repo) as engine:
        result = engine.infer_sync("iris-rf", X[:10], outputs=["predict", "predict_proba"])
        assert list(result) == ["predict", "predict_proba"]
        np.testing.assert_array_equal(result["predict"], estimator.predict(X[:10]))
        np.testing.assert_allclose(result["predict_proba"], estimator.predict_proba(X[:10]))
        assert result.response.model_name == "iris-rf"
        frame = result.as_dataframe()
        assert list(frame.columns) == ["predict", *(f"predict_proba_{k}" for k in range(3))]
        assert frame["predict"].tolist() == estimator.predict(X[:10]).tolist()
        # A mapping of input name to array, and a V2 request dict whose data is an ndarray.
        by_name = engine.infer_sync("iris-rf", {"x": X[:10]})
        document = {"inputs": [{"name": "x", "shape": [10, 4], "datatype": "FP64", "data": X[:10]}]}
        assert (
            by_name["predict"].tolist()
            == engine.infer_sync("iris-rf", document)["predict"].tolist()
        )
        assert {m["name"] for m in engine.models()} == {"iris-logreg", "iris-rf"}


def test_errors_raise_with_their_message(iris_repo: Path) -> None:
    with inferpool.Engine(iris_repo) as engine:
        with pytest.raises(ModelNotFound, match=r"^model 'missing' not found$"):
            engine.infer_sync("missing", ROWS)
        with pytest.raises(BadRequest, match="4 features"):
            engine.infer_sync("iris-rf", np.array([[1.0, 2.0]]))
        with pytest.raises(BadRequest, match="has no output 'nope'"):
            engine.infer_sync("iris-rf", ROWS, outputs=["nope"])
    with pytest.raises(RuntimeError, match="not started"):
        asyncio.run(inferpool.Engine(iris_repo).infer("iris-rf", ROWS))
    with pytest.raises(RuntimeError, match="use 'with Engine"):
        inferpool.Engine(iris_repo).infer_sync("iris-rf", ROWS)


def test_async_engine_loads_and_unloads(iris_repo: Path) -> None:
    async def main() -> list[list[str]]:
        seen = []
        async with inferpool.Engine(iris_repo) as engine:
            assert (await engine.infer("iris-logreg", ROWS))["predict"].tolist() == [0, 2]
            await engine.unload("iris-logreg")
            seen.append(sorted(f"{m['name']} {m['state']}" for m in engine.models()))
            with pytest.raises(ModelNotFound, match="'iris-logreg' was unloaded"):
                await engine.infer("iris-logreg", ROWS)
            with pytest.raises(ModelNotFound, match="not in the model repository"):
                await engine.load("nothing-like-it")
            await engine.load("iris-logreg")
            seen.append(sorted(f"{m['name']} {m['state']}" for m in engine.models()))
            assert (await engine.infer("iris-logreg", ROWS))["predict"].tolist() == [0, 2]
        return seen

    assert asyncio.run(main()) == [
        ["iris-logreg UNAVAILABLE", "iris-rf READY"],
        ["iris-logreg READY", "iris-rf READY"],
    ]


def test_the_embedding_program_is_the_operator(iris_repo: Path, monkeypatch) -> None:
    # The environment may turn the repository API off for servers; an Engine keeps it on
    # unless its own settings say otherwise.
    monkeypatch.setenv("INFERPOOL_MODEL_CONTROL_MODE", "none")
    with inferpool.Engine(iris_repo) as engine:
        engine.unload_sync("iris-rf")
        engine.load_sync("iris-rf")
    with (
        inferpool.Engine(iris_repo, model_control_mode="none") as engine,
        pytest.raises(Forbidden, match="disabled"),
    ):
        engine.unload_sync("iris-rf")


def test_a_failed_model_stops_the_start_up_unless_told(iris_repo: Path, tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.joblib").write_bytes(b"not a pickle")
    engine = inferpool.Engine(tmp_path)
    with pytest.raises(StartupFailed, match=r"^model 'broken' failed to load: ") as caught:
        engine.__enter__()
    assert isinstance(caught.value, RuntimeError)
    assert engine.client is None and engine._loop is None  # closed again
    with inferpool.Engine(tmp_path, exit_on_error=False) as engine:
        assert engine.client is not None and engine.client.started
        assert engine.models()[0]["state"] == "FAILED"


def test_a_request_object_is_not_changed() -> None:
    request = build_request(ROWS, input_name="x")
    assert [(t.name, t.datatype, t.shape) for t in request.inputs] == [("x", "FP64", (2, 4))]
    narrowed = build_request(request, outputs=["predict"], parameters={"a": 1})
    assert [o.name for o in narrowed.outputs] == ["predict"] and narrowed.parameters == {"a": 1}
    assert request.outputs == [] and request.parameters == {}


def test_the_wire_to_workers_carries_raw_tensors() -> None:
    strings = np.array([b"a", b"bc"], dtype=object)
    request = build_request({"x": ROWS.astype(np.float32), "s": strings}, outputs=["y"])
    decoded = grpc_wire.decode(to_wire(request))
    assert decoded.raw_contents  # the worker answers raw too
    assert [o.name for o in decoded.outputs] == ["y"]
    np.testing.assert_array_equal(decoded.inputs[0].data, ROWS.astype(np.float32))
    assert decoded.inputs[1].data.tolist() == [b"a", b"bc"]
    out = Tensor("y", "INT64", (2,), np.array([3, 4]), {"content_type": "np"})
    response = InferenceResponse("m", [out], "v1", "id-1", {"p": 2})
    body, _ = grpc_wire.encode(response, decoded)
    back = from_wire(body)
    assert (back.model_name, back.model_version, back.id) == ("m", "v1", "id-1")
    assert back.parameters == {"p": 2}
    assert back.outputs[0].parameters == {"content_type": "np"}
    back.outputs[0].data[0] = 5  # the caller's own array
    assert back.outputs[0].data.tolist() == [5, 4]


def test_a_pipeline_answers_the_embedded_api(tmp_path: Path) -> None:
    # In-process, typed requests take the wire path for a pipeline (it has no runtime).
    from tests.support.pipelines import build_pipeline_repository

    models = build_pipeline_repository(tmp_path)
    rows = np.array(ROWS, dtype=np.float64)
    with inferpool.Engine(tmp_path) as engine:
        result = engine.infer_sync("mean", rows)
        expected = (models["reg-a"].predict(rows) + models["reg-b"].predict(rows)) / 2
        np.testing.assert_allclose(result["predict"], expected, rtol=1e-9)
        with pytest.raises(BadRequest, match=r"step 1 \('first'\)"):
            engine.infer_sync("chain", -rows)
