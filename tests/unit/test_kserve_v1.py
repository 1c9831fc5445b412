"""KServe V1 bodies to V2 requests and V2 responses to V1 answers (``codecs/kserve_v1.py``,
``protocol/kserve_v1.py``), and the output the worker asks a model for
(``engine/worker/kserve_v1.py``: ``predict``, ``predict_proba`` under KServe's
``PREDICT_PROBA``, a bare Booster's probabilities)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from inferpool.codecs.kserve_v1 import explanations, predictions, to_request
from inferpool.engine.worker.kserve_v1 import v1_endpoint
from inferpool.errors import BadRequest
from inferpool.protocol import kserve_v1 as protocol
from inferpool.protocol.types import InferenceResponse, Tensor
from tests.support import iris_data, write_sklearn_model
from tests.support.runtimes import classification_data, load, save_booster

ROWS = {"name": "input-0", "datatype": "FP32", "shape": [-1, 3]}
NAMED = {**ROWS, "parameters": {"feature_names": ["a", "b", "c"]}}
COLUMNS = [
    {"name": "a", "datatype": "FP64", "shape": [-1, 1]},
    {"name": "b", "datatype": "INT64", "shape": [-1]},
]


def test_rows_become_one_tensor_of_the_inputs_datatype() -> None:
    (tensor,) = to_request([[1, 2, 3], [4, 5, 6.5]], [ROWS]).inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("input-0", "FP32", (2, 3))
    assert tensor.data.dtype == np.float32
    assert tensor.data.tolist() == [[1, 2, 3], [4, 5, 6.5]]


@pytest.mark.parametrize(
    "instances",
    [
        [{"c": 3, "b": 2, "a": 1}, {"b": 5, "a": 4, "c": 6}],  # records
        [{"c": [3, 6], "a": [1, 4], "b": [2, 5]}],  # KServe: an object of columns
        [[{"c": 3, "b": 2, "a": 1}, {"a": 4, "b": 5, "c": 6}]],  # KServe: a list of records
    ],
    ids=["records", "columns", "nested-records"],
)
def test_objects_are_ordered_by_the_feature_names(instances: list) -> None:
    (tensor,) = to_request(instances, [NAMED]).inputs
    assert tensor.shape == (2, 3)
    assert tensor.data.tolist() == [[1, 2, 3], [4, 5, 6]]


def test_an_input_per_column_from_objects_or_rows() -> None:
    for instances in ([{"b": 7, "a": 0.5}, {"a": 1.5, "b": 8}], [[0.5, 7], [1.5, 8]]):
        a, b = to_request(instances, COLUMNS).inputs
        assert (a.name, a.datatype, a.shape) == ("a", "FP64", (2, 1))
        assert a.data.tolist() == [[0.5], [1.5]]
        assert (b.name, b.datatype, b.shape, b.data.tolist()) == ("b", "INT64", (2,), [7, 8])


def test_strings_become_bytes_of_content_type_str() -> None:
    (tensor,) = to_request(
        ["a b", "é"], [{"name": "text", "datatype": "FP64", "shape": [-1, -1]}]
    ).inputs
    assert (tensor.datatype, tensor.shape, tensor.content_type) == ("BYTES", (2,), "str")
    assert tensor.data.tolist() == [b"a b", "é".encode()]


def test_a_text_column_among_objects() -> None:
    specs = [{"name": name, "datatype": "FP64", "shape": [-1, 1]} for name in ("n", "colour")]
    for instances in ([{"n": 1, "colour": "red"}], [[1, "red"]]):
        n, colour = to_request(instances, specs).inputs
        assert (n.datatype, n.data.tolist()) == ("FP64", [[1.0]])
        assert (colour.datatype, colour.data.tolist()) == ("BYTES", [[b"red"]])


def test_requested_outputs() -> None:
    request = to_request([[1, 2, 3]], [ROWS], ["predict_proba"])
    assert [output.name for output in request.outputs] == ["predict_proba"]


@pytest.mark.parametrize(
    ("instances", "inputs", "words"),
    [
        ([[1, 2]], [ROWS], "expects 3 values per instance (input 'input-0'), got 2"),
        ([1, 2], [ROWS], "got a single value"),
        ([[[1, 2, 3]]], [ROWS], "got instances of 2 dimensions"),
        ([[1, 2, 3], [1, 2]], [ROWS], "the same length"),
        ([[1, "x", 3]], [ROWS], "numbers only"),
        ([[1, 2, 1e39]], [ROWS], "out of range"),
        ([[1, 2, 3]], COLUMNS, "each instance must hold 2 values, not 3"),
        ([[1, 2], 3], COLUMNS, "each instance must hold 2 values, not 1"),
        ([[1, 2], ["x", 3]], COLUMNS, "column 'a' must hold strings only"),
        ([{"a": 1, "b": 2}], [NAMED], "missing feature(s) c"),
        ([{"a": 1}], COLUMNS, "missing column(s) b"),
        ([{"a": 1}, [1, 2]], COLUMNS, "mixing objects"),
        (["x", 1], [ROWS], "mixing strings"),
        (["x"], COLUMNS, "strings fit a model of one input"),
        ([{"a": 1, "b": "x", "c": 2}], [NAMED], "takes numbers only"),
        ([[1, 2, 3]], [], "declares no inputs"),
    ],
)
def test_what_does_not_fit_is_a_400(instances: list, inputs: list, words: str) -> None:
    with pytest.raises(BadRequest) as raised:
        to_request(instances, inputs)
    assert words in raised.value.message


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{", "Unrecognized request format"),
        (b"[1]", "JSON object"),
        (b'{"rows": []}', 'Expected "instances" or "inputs"'),
        (b'{"instances": 3}', 'Expected "instances" to be a list'),
        (b'{"inputs": {}}', 'Expected "inputs" to be a list'),
        (b'{"instances": []}', '"instances" is empty'),
        (b'{"instances": ' + b"[" * 200 + b"]" * 200 + b"}", "nested deeper"),
    ],
)
def test_bad_bodies(body: bytes, words: str) -> None:
    with pytest.raises(BadRequest) as raised:
        protocol.instances(body)
    assert words in raised.value.message


def test_inputs_wins_over_instances() -> None:
    assert protocol.instances(b'{"instances": [[1]], "inputs": [[2]]}') == [[2]]


def response(*tensors: Tensor, **parameters) -> InferenceResponse:
    return InferenceResponse("m", list(tensors), parameters=dict(parameters))


def test_predictions_one_entry_per_row() -> None:
    column = Tensor("predict", "FP32", (3, 1), np.array([[0.5], [1.5], [2.5]], np.float32))
    assert orjson.loads(predictions(response(column))) == {"predictions": [0.5, 1.5, 2.5]}
    two = Tensor("predict_proba", "FP64", (2, 2), np.array([[0.25, 0.75], [0.5, 0.5]]))
    assert orjson.loads(predictions(response(two))) == {"predictions": [[0.25, 0.75], [0.5, 0.5]]}
    assert orjson.loads(predictions(response(two), positive=True)) == {"predictions": [0.75, 0.5]}
    labels = Tensor("predict", "BYTES", (2,), np.array([b"cat", b"dog"], dtype=object))
    assert orjson.loads(predictions(response(labels))) == {"predictions": ["cat", "dog"]}


def test_several_outputs_give_an_object_per_row() -> None:
    label = Tensor("label", "INT64", (2,), np.array([1, 0]))
    score = Tensor("score", "FP64", (2, 1), np.array([[0.9], [0.2]]))
    assert orjson.loads(predictions(response(label, score))) == {
        "predictions": [{"label": 1, "score": 0.9}, {"label": 0, "score": 0.2}]
    }


def test_explanations() -> None:
    values = np.array([[0.1, 0.2, 0.7]])
    tensor = Tensor("contributions", "FP64", (1, 3), values, {"score": "value"})
    assert orjson.loads(explanations(response(tensor))) == {
        "explanations": {"contributions": [[0.1, 0.2, 0.7]], "score": "value"}
    }


@pytest.fixture(scope="module")
def forest(tmp_path_factory: pytest.TempPathFactory):
    from sklearn.ensemble import RandomForestClassifier

    X, y = iris_data()
    estimator = RandomForestClassifier(10, random_state=0, n_jobs=1).fit(X, y)
    folder = write_sklearn_model(tmp_path_factory.mktemp("v1") / "forest", estimator)
    return load(folder), estimator


def call(model, rows: np.ndarray, path: str = protocol.PREDICT) -> object:
    handler = v1_endpoint(path, model)
    assert handler is not None
    return orjson.loads(handler(orjson.dumps({"instances": rows.tolist()})))["predictions"]


def test_predict_unless_kserves_predict_proba(forest, monkeypatch: pytest.MonkeyPatch) -> None:
    model, estimator = forest
    X = iris_data()[0][::40]
    assert call(model, X) == estimator.predict(X).tolist()
    monkeypatch.setenv("PREDICT_PROBA", "True")
    np.testing.assert_allclose(call(model, X), estimator.predict_proba(X))
    monkeypatch.setenv("PREDICT_PROBA", "false")
    assert call(model, X) == estimator.predict(X).tolist()
    assert v1_endpoint("explain", model) is None  # the V2 endpoint's, not V1's


def test_a_bare_booster_answers_its_own_predict(tmp_path: Path) -> None:
    """A binary XGBoost Booster: the positive class's probability, as ``Booster.predict``;
    the same model wrapped by scikit-learn's API answers labels (sklearnserver's)."""
    import xgboost

    X, y = classification_data(2)
    classifier = xgboost.XGBClassifier(n_estimators=5, max_depth=3, n_jobs=1).fit(X, y)
    booster = load(save_booster(tmp_path / "booster", classifier.get_booster(), "model.json"))
    wrapped = load(write_sklearn_model(tmp_path / "wrapped", classifier, "model.joblib"))
    expected = classifier.get_booster().predict(xgboost.DMatrix(X[:5]))
    np.testing.assert_allclose(call(booster, X[:5]), expected, rtol=1e-6)
    assert call(wrapped, X[:5]) == classifier.predict(X[:5]).tolist()


def test_mlservers_xgboost_flavour_answers_as_xgbserver(tmp_path: Path) -> None:
    """KServe's runtime passes ``mlserver_xgboost.XGBoostModel``: a file an XGBClassifier
    saved still answers its Booster's ``predict`` over V1, as KServe's xgbserver reads it."""
    import json

    import xgboost

    X, y = classification_data(3)
    classifier = xgboost.XGBClassifier(n_estimators=5, max_depth=3, n_jobs=1).fit(X, y)
    folder = tmp_path / "flavoured"
    folder.mkdir()
    classifier.save_model(str(folder / "model.json"))
    settings = {"implementation": "mlserver_xgboost.XGBoostModel"}
    (folder / "model-settings.json").write_text(json.dumps(settings))
    expected = classifier.get_booster().predict(xgboost.DMatrix(X[:4]))  # [n, 3]
    np.testing.assert_allclose(call(load(folder), X[:4]), expected, rtol=1e-6)
