"""The ONNX Runtime runtime loaded in this process: metadata from the graph, ZipMap and
labels answered as tensors, FP64 rows cast for float32 graphs, answers equal to the
libraries' own, batching only for converters' row-wise graphs, the session's threads,
and load errors in one sentence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferpool.engine.worker import inference
from inferpool.engine.worker.batching import policy
from inferpool.errors import BadRequest, ModelLoadError
from inferpool.protocol.types import InferenceRequest, Tensor
from tests.runtimes.onnx_models import (
    ATOL,
    RTOL,
    Converted,
    assert_library_answers,
    repository,
    two_input_graph,
)
from tests.support.runtimes import infer, load


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx")


@pytest.fixture(scope="module")
def converted(root: Path) -> dict[str, Converted]:
    return repository(root)


def test_metadata_comes_from_the_graph(root: Path, converted: dict[str, Converted]) -> None:
    metadata = load(root / "sk-logreg").metadata

    assert metadata["platform"] == "onnx"
    assert metadata["inputs"] == [{"name": "float_input", "datatype": "FP32", "shape": [-1, 8]}]
    assert metadata["outputs"] == [
        {"name": "output_label", "datatype": "INT64", "shape": [-1]},
        {"name": "output_probability", "datatype": "FP32", "shape": [-1, -1]},
    ]
    labels = load(root / "sk-labels").metadata["outputs"][0]
    assert (labels["name"], labels["datatype"]) == ("output_label", "BYTES")
    two = load(root / "add-two").metadata
    assert [(s["name"], s["shape"]) for s in two["inputs"]] == [("a", [-1, 2]), ("b", [-1, 2])]


@pytest.mark.parametrize(
    "name", ["sk-logreg", "sk-labels", "sk-ridge", "lgb-classifier", "xgb-regressor"]
)
def test_answers_equal_the_library_within_float32(
    name: str, root: Path, converted: dict[str, Converted]
) -> None:
    model = converted[name]
    answers = infer(load(root / name), model.rows)  # FP64 rows: cast for the graph
    assert_library_answers(model, answers)


def test_zipmap_columns_follow_the_classes_order(
    root: Path, converted: dict[str, Converted]
) -> None:
    runtime = load(root / "sk-labels").runtime
    rows = converted["sk-labels"].rows
    raw = runtime.session.run(["output_probability"], {"float_input": rows.astype(np.float32)})[0]
    assert list(raw[0]) == ["ant", "bee", "cat"]  # ZipMap's keys: the model's classes_
    (probabilities,) = runtime.predict(rows, ["output_probability"]).values()
    assert probabilities.dtype == np.float32 and probabilities.shape == (len(rows), 3)
    assert probabilities[0].tolist() == [raw[0][k] for k in ("ant", "bee", "cat")]


def test_one_requested_output_only(root: Path, converted: dict[str, Converted]) -> None:
    answers = infer(load(root / "lgb-classifier"), converted["lgb-classifier"].rows, ["label"])
    assert list(answers) == ["label"]


def test_inputs_by_name_for_a_graph_of_several(root: Path, converted: dict[str, Converted]) -> None:
    model = load(root / "add-two")
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    request = InferenceRequest(
        [Tensor("b", "FP64", a.shape, a * 10), Tensor("a", "FP64", a.shape, a)]
    )
    (output,) = inference.infer(model, request).outputs
    assert output.name == "sum"
    np.testing.assert_array_equal(np.asarray(output.data).reshape(2, 2), a * 11)

    wrong = InferenceRequest([Tensor("a", "FP64", a.shape, a), Tensor("c", "FP64", a.shape, a)])
    with pytest.raises(BadRequest, match=r"has no input 'c'; expected: 'a', 'b'"):
        inference.infer(model, wrong)
    alone = InferenceRequest([Tensor("a", "FP64", a.shape, a)])
    with pytest.raises(BadRequest, match=r"is missing input 'b'"):
        inference.infer(model, alone)


def test_wrong_width_is_a_400_naming_the_shape(root: Path, converted: dict[str, Converted]) -> None:
    model = load(root / "sk-ridge")
    with pytest.raises(BadRequest, match=r"expects shape \[-1, 8\], got \[2, 5\]"):
        infer(model, np.zeros((2, 5)))


def test_converted_graphs_batch_and_a_hand_made_one_does_not(
    root: Path, converted: dict[str, Converted]
) -> None:
    for name in converted:
        model = load(root / name)
        assert model.runtime.rows_independent, name
        assert policy(model.settings, model.runtime).joins, name
    hand = load(root / "add-two")
    assert not hand.runtime.rows_independent
    assert not policy(hand.settings, hand.runtime).joins


def test_joined_rows_split_back_per_request(root: Path, converted: dict[str, Converted]) -> None:
    # What adaptive batching does with two queued requests: one predict, rows split back.
    model = converted["sk-logreg"]
    runtime = load(root / "sk-logreg").runtime
    joined = runtime.predict(model.rows, ["output_probability"])["output_probability"]
    first = runtime.predict(model.rows[:5], ["output_probability"])["output_probability"]
    np.testing.assert_array_equal(joined[:5], first)


def test_threads_follow_the_workers_share(
    root: Path, converted: dict[str, Converted], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what a worker sets before loading
    runtime = load(root / "sk-ridge").runtime
    assert runtime.threads == 1
    session = runtime.session
    runtime.limit_threads(1)
    assert runtime.session is session, "already sized: not created again"
    runtime.limit_threads(2)
    assert runtime.session is not session and runtime.threads == 2
    assert runtime.predictor().endswith("(2 intra-op threads)")
    rows = converted["sk-ridge"].rows
    np.testing.assert_allclose(
        runtime.predict(rows, ["variable"])["variable"],
        converted["sk-ridge"].expected["variable"],
        rtol=RTOL,
        atol=ATOL,
    )


def test_a_corrupt_file_fails_in_one_sentence(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"this is not a protobuf graph at all")
    with pytest.raises(ModelLoadError) as failure:
        load(folder)
    message = str(failure.value)
    assert "model.onnx" in message and "ONNX Runtime" in message
    assert "\n" not in message


def test_declared_inputs_win_over_the_graph(tmp_path: Path) -> None:
    declared = [
        {"name": "a", "datatype": "FP64", "shape": [-1, 2]},
        {"name": "b", "datatype": "FP64", "shape": [-1, 2]},
    ]
    two_input_graph(tmp_path, "declared", {"name": "declared", "inputs": declared})
    metadata = load(tmp_path / "declared").metadata
    assert metadata["inputs"] == declared
    assert metadata["outputs"] == [{"name": "sum", "datatype": "FP32", "shape": [-1, 2]}]


def test_a_graph_this_onnx_runtime_cannot_run_says_why(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"])], "g", [x], [y])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    (tmp_path / "unknown-op").mkdir()
    (tmp_path / "unknown-op" / "model.onnx").write_bytes(proto.SerializeToString())

    with pytest.raises(ModelLoadError) as failure:
        load(tmp_path / "unknown-op")

    message = str(failure.value)
    assert message.startswith("ONNX Runtime ") and "cannot load model.onnx: " in message
    assert "No Op registered for NoSuchOp" in message
    assert "[ONNXRuntimeError]" not in message and str(tmp_path) not in message
    assert "\n" not in message


def test_weights_in_an_external_file_beside_the_graph(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "g", [x], [y], [numpy_helper.from_array(weights, "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    (tmp_path / "external").mkdir()
    onnx.save_model(
        proto,
        str(tmp_path / "external" / "model.onnx"),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    assert (tmp_path / "external" / "model.onnx.data").stat().st_size == weights.nbytes

    rows = np.array([[1.0, 2.0]])
    answers = infer(load(tmp_path / "external"), rows)
    np.testing.assert_array_equal(answers["y"], rows @ weights)
