"""scikit-learn random forests and extra-trees for the kernel.

scikit-learn compares float32 features (it casts its input) with float64 thresholds, a
NaN following the node's ``missing_go_to_left``; a classifier's forest averages each
tree's normalised class counts, a regressor's its leaf values, adding tree by tree in
order. Rows holding NaN or infinity are left to scikit-learn, which either predicts them
or rejects them with its own message.

``tree_arrays`` and ``payload_rows`` serve the gradient-boosting importer too
(``from_sklearn_boosting``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferpool.runtimes.tabular import numeric_matrix
from inferpool.runtimes.trees.forest import (
    NAN_LEFT,
    Forest,
    ForestBuilder,
    NodeArrays,
    Unsupported,
)
from inferpool.runtimes.trees.verify import probe_rows

SUPPORTED = (
    "RandomForestClassifier",
    "RandomForestRegressor",
    "ExtraTreesClassifier",
    "ExtraTreesRegressor",
)
# The kernel lays out about 50 million nodes a second; the limit keeps a model's layout
# (16 bytes a node plus its leaf values) to a few hundred MiB.
MAX_NODES = 20_000_000


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
            add_tree(builder, estimator.tree_, self.classes is not None, width)
        self.n_trees = len(model.estimators_)
        self.forest: Forest = builder.build(width, input_dtype=np.float32)

    def rows(self, payload: Any) -> np.ndarray | None:
        """The payload as finite float32 rows, or None to leave it to scikit-learn."""
        return payload_rows(payload, self.forest, finite=True)

    def probes(self) -> list[np.ndarray]:
        """The rows ``verify`` compares the kernel and scikit-learn on."""
        return [probe_rows(self.forest, np.float32, nonfinite=False)]

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


def payload_rows(payload: Any, forest: Forest, finite: bool) -> np.ndarray | None:
    """The payload as the kernel's rows (numbers, ``forest.n_features`` columns; only
    finite values if ``finite``), or None to leave it to scikit-learn."""
    matrix = numeric_matrix(payload, forest.n_features)
    if matrix is None:
        return None
    rows = forest.features(matrix)
    return rows if not finite or np.isfinite(rows).all() else None


def tree_arrays(tree: Any, values: np.ndarray) -> NodeArrays:
    """A scikit-learn ``Tree`` as ``ForestBuilder.add_arrays`` takes it (without the
    column), with ``values`` (one row per node) as its leaf values."""
    nan_left = getattr(tree, "missing_go_to_left", None)
    flags = np.zeros(tree.node_count, dtype=np.uint32)
    if nan_left is not None:
        flags[np.asarray(nan_left, dtype=bool)] = NAN_LEFT
    return (
        tree.children_left,
        tree.children_right,
        tree.feature,
        tree.threshold,
        flags,
        values,
    )


def add_tree(builder: ForestBuilder, tree: Any, classifier: bool, width: int) -> None:
    """Add a scikit-learn ``Tree`` of a forest (or a lone decision tree) to ``builder``."""
    values = node_values(tree, classifier, width)
    builder.add_arrays(*tree_arrays(tree, values), weights=tree.weighted_n_node_samples)


def node_values(tree: Any, classifier: bool, width: int) -> np.ndarray:
    """Each node's values (nodes x width) as the tree predicts them at its leaves: a
    classifier's class fractions, a regressor's values."""
    if classifier:
        # DecisionTreeClassifier.predict_proba's normalisation, leaf by leaf.
        values: np.ndarray = tree.value[:, 0, :width].astype(np.float64)
        normaliser = values.sum(axis=1)[:, np.newaxis]
        normaliser[normaliser == 0.0] = 1.0
        fractions: np.ndarray = values / normaliser
        return fractions
    regression: np.ndarray = tree.value[:, :, 0].astype(np.float64)
    return regression
