"""A CatBoost model for the kernel: its oblivious trees from the model's JSON export
(``save_model(format="json")``), summed and scaled as CatBoost computes ``RawFormulaVal``
(``scale * sum + bias``), then turned into the runtime's outputs as CatBoost's
``predict`` turns it: a classifier's ``Probability`` (sigmoid of a binary model's value,
softmax of a multi-class model's) and ``Class``, a regressor's value (its exponent for
Poisson and Tweedie), a ranker's score.

Numeric features only: a model with categorical features (one-hot or counters), text
features or embeddings, or with trees that are not symmetric (``grow_policy`` Depthwise or
Lossguide), is ``Unsupported`` and keeps CatBoost's own predictor.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from inferpool.runtimes.trees.forest import Unsupported, libm_exp, libm_sigmoid
from inferpool.runtimes.trees.oblivious import ObliviousForest, ObliviousTree

RAW_OUTPUT = "raw_formula_val"
BINARY_LOSSES = {"Logloss", "CrossEntropy"}
# Losses whose regressor's ``predict`` is the exponent of the raw value (CatBoost's
# ``_get_default_prediction_type``); a prefix, as CatBoost compares it.
EXPONENT_LOSSES = ("Poisson", "Tweedie")
# CatBoost's features the kernel does not compute: their key in the JSON export.
OTHER_FEATURES = {
    "categorical_features": "categorical features",
    "text_features": "text features",
    "embedding_features": "embedding features",
}


def model_json(model: Any) -> dict[str, Any]:
    """The model as CatBoost exports it to JSON (CatBoost writes it to a file only)."""
    with tempfile.TemporaryDirectory(prefix="inferpool-catboost-") as folder:
        path = Path(folder) / "model.json"
        model.save_model(str(path), format="json")
        exported: dict[str, Any] = json.loads(path.read_text())
        return exported


class CompiledCatBoost:
    """The runtime's outputs of a CatBoost model (``output``), shaped as CatBoost's calls
    shape them. ``classes``: a classifier's labels (None: a regressor or a ranker)."""

    def __init__(self, exported: dict[str, Any], classes: np.ndarray | None, n_features: int):
        self.classes = classes
        self.forest = _forest(exported, n_features)
        scale, bias = exported.get("scale_and_bias", [1.0, [0.0]])
        self.scale = float(scale)
        self.bias = np.atleast_1d(np.asarray(bias, dtype=np.float64))
        if self.bias.size != self.forest.width:
            raise Unsupported(f"{self.bias.size} biases for {self.forest.width} dimensions")
        loss = exported.get("model_info", {}).get("params", {}).get("loss_function", {})
        self.loss = str(loss.get("type", ""))
        self.probabilities, self.predict = self._links()

    def raw(self, matrix: Any) -> np.ndarray:
        """CatBoost's ``RawFormulaVal``: one column is 1-D."""
        sums = self.forest.accumulate(matrix)
        if self.scale != 1.0:
            sums *= self.scale
        sums += self.bias
        return sums[:, 0] if self.forest.width == 1 else sums

    def output(self, name: str, matrix: Any) -> np.ndarray:
        raw = self.raw(matrix)
        if name == RAW_OUTPUT:
            return raw
        if name == "predict_proba":
            return self.probabilities(raw)
        return self.predict(raw)

    def _links(self) -> tuple[Callable[[np.ndarray], np.ndarray], Callable[..., np.ndarray]]:
        """The functions from raw values to ``predict_proba`` and to ``predict``."""
        if self.classes is None:
            if self.loss.startswith(EXPONENT_LOSSES):
                return _refused, libm_exp
            if self.loss == "RMSEWithUncertainty":
                raise Unsupported(f"loss {self.loss}")
            return _refused, _identity
        classes = self.classes
        probabilities: Callable[[np.ndarray], np.ndarray]
        if self.loss in BINARY_LOSSES and self.forest.width == 1:
            return _two_classes, lambda raw: classes[(raw > 0).astype(np.intp)]
        if self.loss == "MultiClass":
            probabilities = _softmax
        elif self.loss == "MultiClassOneVsAll":
            probabilities = libm_sigmoid
        else:
            raise Unsupported(f"classifier loss {self.loss!r}")
        return probabilities, lambda raw: classes[np.argmax(raw, axis=1)]


def _identity(raw: np.ndarray) -> np.ndarray:
    return raw


def _refused(raw: np.ndarray) -> np.ndarray:
    raise ValueError("predict_proba is a classifier's output")


def _two_classes(raw: np.ndarray) -> np.ndarray:
    positive = libm_sigmoid(raw)
    return np.column_stack([1.0 - positive, positive])


def _softmax(raw: np.ndarray) -> np.ndarray:
    shifted = libm_exp(raw - raw.max(axis=1, keepdims=True))
    probabilities: np.ndarray = shifted / shifted.sum(axis=1, keepdims=True)
    return probabilities


def _forest(exported: dict[str, Any], n_features: int) -> ObliviousForest:
    """The model's trees laid out, or ``Unsupported`` with what the kernel lacks."""
    features = exported.get("features_info", {})
    for key, what in OTHER_FEATURES.items():
        if features.get(key):
            raise Unsupported(what)
    if "oblivious_trees" not in exported:
        raise Unsupported("trees that are not symmetric (grow_policy Depthwise or Lossguide)")
    floats = features.get("float_features", [])
    # A float feature's place among the model's features (its column in a request).
    column = {int(f["feature_index"]): int(f["flat_feature_index"]) for f in floats}
    nan_above = {column[int(f["feature_index"])] for f in floats if _nan_above(f)}
    n_dims = len(np.atleast_1d(exported.get("scale_and_bias", [1.0, [0.0]])[1]))
    trees = []
    for tree in exported["oblivious_trees"]:
        splits = tree.get("splits", [])
        if any(split.get("split_type") != "FloatFeature" for split in splits):
            raise Unsupported("a split on something other than a number")
        values = np.asarray(tree["leaf_values"], dtype=np.float64)
        trees.append(
            ObliviousTree(
                features=[column[int(s["float_feature_index"])] for s in splits],
                borders=[float(s["border"]) for s in splits],
                leaves=values.reshape(-1, n_dims),
            )
        )
    return ObliviousForest.build(trees, n_features, n_dims, nan_above)


def _nan_above(feature: dict[str, Any]) -> bool:
    """Whether CatBoost counts a NaN of the feature as above every border."""
    treatment = feature.get("nan_value_treatment", "AsIs")
    if treatment not in ("AsIs", "AsFalse", "AsTrue"):
        raise Unsupported(f"nan_value_treatment {treatment!r}")
    return bool(treatment == "AsTrue")
