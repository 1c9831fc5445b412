"""ONNX models for the ONNX Runtime tests, converted here from models trained on the fly
(skl2onnx for scikit-learn, onnxmltools for LightGBM and XGBoost), each with the rows to
send and what its own library predicts for them.

The rows are float64 values that float32 holds exactly: the graphs compute in float32, so
the library and the graph see the same numbers and differ only by float32 rounding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.support.runtimes import classification_data, lightgbm_estimator, xgboost_estimator

# How far a float32 graph may be from its library's float64 answer.
RTOL, ATOL = 1e-4, 1e-5
# The newest ai.onnx opset ONNX Runtime 1.20 runs.
TARGET_OPSET = 21


@dataclass
class Converted:
    """A converted model: its folder's name, its rows and the library's answer per output."""

    name: str
    rows: np.ndarray
    expected: dict[str, np.ndarray] = field(default_factory=dict)


def float32_exact(X: np.ndarray) -> np.ndarray:
    return np.asarray(X, dtype=np.float32).astype(np.float64)


def _float_input(n_features: int, converter: str = "skl2onnx"):
    """The converter's own FloatTensorType (each checks for its class): [rows, n]."""
    if converter == "onnxmltools":
        from onnxmltools.convert.common.data_types import FloatTensorType
    else:
        from skl2onnx.common.data_types import FloatTensorType

    return [("float_input", FloatTensorType([None, n_features]))]


def _skl2onnx(model, n_features: int):
    """skl2onnx's graph of ``model``, at an opset that ONNX Runtime 1.20 (the ``onnx``
    extra's lower bound) runs: the newest converter stamps opsets newer than that."""
    from skl2onnx import convert_sklearn

    return convert_sklearn(model, initial_types=_float_input(n_features), target_opset=TARGET_OPSET)


def _write(folder: Path, model_proto, settings: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(model_proto.SerializeToString())
    if settings is not None:
        (folder / "model-settings.json").write_text(json.dumps(settings))


def sklearn_classifier(root: Path, string_labels: bool = False) -> Converted:
    """LogisticRegression on 3 classes, converted with skl2onnx's default ZipMap."""
    from sklearn.linear_model import LogisticRegression

    X, y = classification_data(3)
    X = float32_exact(X)
    if string_labels:
        y = np.array(["ant", "bee", "cat"])[y]
    model = LogisticRegression(max_iter=1000).fit(X, y)
    name = "sk-labels" if string_labels else "sk-logreg"
    _write(root / name, _skl2onnx(model, X.shape[1]))
    rows = X[:12]
    expected = {
        "output_label": model.predict(rows),
        "output_probability": model.predict_proba(rows),
    }
    return Converted(name, rows, expected)


def sklearn_regressor(root: Path) -> Converted:
    """Ridge on 8 features: one output ``variable``, [rows, 1]."""
    from sklearn.linear_model import Ridge

    from tests.support.runtimes import regression_data

    X, y = regression_data()
    X = float32_exact(X)
    model = Ridge().fit(X, y)
    _write(root / "sk-ridge", _skl2onnx(model, X.shape[1]))
    rows = X[:12]
    return Converted("sk-ridge", rows, {"variable": model.predict(rows).reshape(-1, 1)})


def lightgbm_classifier(root: Path) -> Converted:
    """LGBMClassifier (3 classes, 10 trees) converted with onnxmltools."""
    model, X = lightgbm_estimator("classifier")
    rows = float32_exact(X[:12])
    expected = {"label": model.predict(rows), "probabilities": model.predict_proba(rows)}
    return _onnxmltools(root, "lgb-classifier", "convert_lightgbm", model, rows, expected)


def xgboost_regressor(root: Path) -> Converted:
    """XGBRegressor (10 trees) converted with onnxmltools."""
    model, X = xgboost_estimator("regressor")
    rows = float32_exact(X[:12])
    expected = {"variable": model.predict(rows).reshape(-1, 1)}
    return _onnxmltools(root, "xgb-regressor", "convert_xgboost", model, rows, expected)


def _onnxmltools(
    root: Path, name: str, converter: str, model, rows: np.ndarray, expected: dict
) -> Converted:
    import onnxmltools

    convert = getattr(onnxmltools, converter)
    _write(root / name, convert(model, initial_types=_float_input(rows.shape[1], "onnxmltools")))
    return Converted(name, rows, expected)


def repository(root: Path) -> dict[str, Converted]:
    """Every converted model and the two-input graph in ``root``, by name."""
    models = [
        sklearn_classifier(root),
        sklearn_classifier(root, string_labels=True),
        sklearn_regressor(root),
        lightgbm_classifier(root),
        xgboost_regressor(root),
    ]
    two_input_graph(root)
    return {model.name: model for model in models}


def assert_library_answers(model: Converted, answers: dict[str, np.ndarray]) -> None:
    """``answers`` hold every graph output, equal to the library's: labels exactly,
    numbers within float32 tolerance."""
    assert set(answers) == set(model.expected), "every graph output when none is named"
    for name, expected in model.expected.items():
        got = answers[name]
        if expected.dtype.kind in "iuU":
            assert got.tolist() == expected.tolist(), name
        else:
            assert got.shape == expected.shape, name
            np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL, err_msg=name)


def two_input_graph(root: Path, name: str = "add-two", settings: dict | None = None) -> None:
    """A graph written by hand: ``sum = a + b`` over float [N, 2] inputs ``a`` and ``b``."""
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 2])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 2])
    total = helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["N", 2])
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"])], "add", [a, b], [total]
    )
    proto = helper.make_model(
        graph, producer_name="hand", opset_imports=[helper.make_opsetid("", 13)]
    )
    proto.ir_version = 8  # read by every ONNX Runtime inferpool supports
    _write(root / name, proto, settings)
