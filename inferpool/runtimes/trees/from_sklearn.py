"""scikit-learn random forests and extra-trees for the kernel.

scikit-learn compares float32 features (it casts its input) with float64 thresholds, a
NaN following the node's ``missing_go_to_left``; a classifier's forest averages each
tree's normalised class counts, a regressor's its leaf values, adding tree by tree in
order. Rows holding NaN or infinity are left to scikit-learn, which either predicts them
or rejects them with its own message.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferpool.runtimes.tabular import NUMERIC_KINDS, is_dataframe
from inferpool.runtimes.trees.forest import Forest, ForestBuilder, Split, Unsupported

SUPPORTED = (
    "RandomForestClassifier",
    "RandomForestRegressor",
    "ExtraTreesClassifier",
    "ExtraTreesRegressor",
)
# Laying out is a Python loop over nodes (about a second per million).
MAX_NODES = 2_000_000


def is_forest(model: Any) -> bool:
    """Whether ``model`` is one of scikit-learn's forests the kernel takes."""
    kind = type(model)
    return kind.__module__.split(".")[0] == "sklearn" and kind.__name__ in SUPPORTED


class CompiledSKLearnForest:
    """``predict`` (and ``predict_proba`` of a classifier) of a fitted forest."""

    def __init__(self, model: Any) -> None:
        if not is_forest(model):
            raise Unsupported(f"{type(model).__name__} is not a random forest or extra-trees")
        if model.n_outputs_ != 1 and hasattr(model, "classes_"):
            raise Unsupported("a classifier with several outputs")
        nodes = sum(tree.tree_.node_count for tree in model.estimators_)
        if nodes > MAX_NODES:
            raise Unsupported(f"{nodes:,} nodes (the kernel takes up to {MAX_NODES:,})")
        self.classes = getattr(model, "classes_", None)
        self.n_outputs = int(model.n_outputs_)
        width = len(self.classes) if self.classes is not None else self.n_outputs
        builder = ForestBuilder(int(model.n_features_in_), width)
        for estimator in model.estimators_:
            _add_tree(builder, estimator.tree_, self.classes is not None, width)
        self.n_trees = len(model.estimators_)
        self.forest: Forest = builder.build(width, input_dtype=np.float32)

    def rows(self, payload: Any) -> np.ndarray | None:
        """The payload as finite float32 rows, or None to leave it to scikit-learn."""
        if is_dataframe(payload):
            if any(dtype.kind not in NUMERIC_KINDS for dtype in payload.dtypes):
                return None
            payload = payload.to_numpy()
        if not isinstance(payload, np.ndarray) or payload.dtype.kind not in NUMERIC_KINDS:
            return None
        if payload.ndim != 2 or payload.shape[1] != self.forest.n_features:
            return None
        rows = self.forest.features(payload)
        return rows if np.isfinite(rows).all() else None

    def _average(self, rows: np.ndarray) -> np.ndarray:
        total = self.forest.accumulate(rows)
        total /= self.n_trees
        return total

    def predict_proba(self, rows: np.ndarray) -> np.ndarray:
        return self._average(rows)

    def predict(self, rows: np.ndarray) -> np.ndarray:
        average = self._average(rows)
        if self.classes is not None:
            labels: np.ndarray = self.classes.take(np.argmax(average, axis=1), axis=0)
            return labels
        return average[:, 0] if self.n_outputs == 1 else average

    def methods(self) -> dict[str, Any]:
        """The estimator methods the kernel computes, by name."""
        if self.classes is None:
            return {"predict": self.predict}
        return {"predict": self.predict, "predict_proba": self.predict_proba}


def _add_tree(builder: ForestBuilder, tree: Any, classifier: bool, width: int) -> None:
    left, right = tree.children_left, tree.children_right
    feature, threshold = tree.feature, tree.threshold
    nan_left = getattr(tree, "missing_go_to_left", None)
    if classifier:
        # DecisionTreeClassifier.predict_proba's normalisation, leaf by leaf.
        values = tree.value[:, 0, :width].astype(np.float64)
        normaliser = values.sum(axis=1)[:, np.newaxis]
        normaliser[normaliser == 0.0] = 1.0
        values = values / normaliser
    else:
        values = tree.value[:, :, 0].astype(np.float64)

    def describe(node: int) -> Split | np.ndarray:
        if left[node] == -1:
            leaf: np.ndarray = values[node]
            return leaf
        return Split(
            feature=int(feature[node]),
            threshold=float(threshold[node]),
            left=int(left[node]),
            right=int(right[node]),
            nan_left=bool(nan_left[node]) if nan_left is not None else False,
        )

    builder.add_tree(0, describe)
