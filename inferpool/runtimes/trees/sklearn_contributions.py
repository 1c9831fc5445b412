"""Saabas contributions of scikit-learn's tree models: random forests and extra-trees
(class probabilities or values, averaged over the trees), lone decision trees, and
gradient boosting and histogram-based gradient boosting (raw scores: the sums before the
loss's link, with the baseline in the bias).

The forest is the one the tree kernel predicts with when the model has one, else one
laid out for explaining alone (the first explanation pays for it), so explanations do not
depend on ``tree_kernel`` being on. ``trees.contributions`` walks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inferpool.runtimes.linear_steps import is_sklearn
from inferpool.runtimes.trees.contributions import PathValues, SourceTree
from inferpool.runtimes.trees.forest import ForestBuilder, Unsupported
from inferpool.runtimes.trees.from_sklearn import (
    CompiledSKLearnForest,
    add_tree,
    is_forest,
    node_values,
    payload_rows,
)
from inferpool.runtimes.trees.from_sklearn_boosting import (
    HIST_GRADIENT_BOOSTING,
    CompiledBoosting,
    is_boosting,
)

DECISION_TREES = (
    "DecisionTreeClassifier",
    "DecisionTreeRegressor",
    "ExtraTreeClassifier",
    "ExtraTreeRegressor",
)


def explains_trees(model: Any) -> bool:
    """Whether ``model`` is a scikit-learn tree model this module explains."""
    return is_forest(model) or is_boosting(model) or is_sklearn(model, DECISION_TREES)


@dataclass(frozen=True)
class TreeContributions:
    """A fitted tree model's contributions: ``of(payload)`` gives rows x score columns x
    (features + 1), features in the model's input order, the bias last."""

    path: PathValues
    #: what the contributions add up to: "probability", "value" or "raw_score"
    score: str
    #: each tree's share of the score (a forest averages its trees)
    scale: float
    #: the payload as the forest's rows (None: not numbers)
    rows: Any
    #: the model's input column of each forest feature (None: the same order)
    order: np.ndarray | None = None

    def of(self, payload: Any) -> np.ndarray | None:
        rows = self.rows(payload)
        if rows is None:
            return None
        values = self.path.contributions(rows)
        if self.scale != 1.0:
            values *= self.scale
        if self.order is None:
            return values
        reordered = np.empty_like(values)
        reordered[:, :, self.order] = values[:, :, :-1]
        reordered[:, :, -1] = values[:, :, -1]
        return reordered


def tree_contributions(model: Any, compiled: Any) -> TreeContributions:
    """The contributions of ``model``, on ``compiled``'s forest when the kernel predicts
    it; ``Unsupported`` says why a model cannot be explained."""
    if is_sklearn(model, DECISION_TREES):
        return _decision_tree(model)
    if is_forest(model):
        if not isinstance(compiled, CompiledSKLearnForest):
            compiled = CompiledSKLearnForest(model)
        classifier = compiled.classes is not None
        forest = compiled.forest
        sources = [
            _source(e.tree_, node_values(e.tree_, classifier, forest.width))
            for e in model.estimators_
        ]
        return TreeContributions(
            PathValues.of(forest, sources),
            "probability" if classifier else "value",
            1.0 / compiled.n_trees,
            lambda payload: payload_rows(payload, forest, finite=False),
        )
    if not isinstance(compiled, CompiledBoosting):
        compiled = CompiledBoosting(model)
    if type(model).__name__ in HIST_GRADIENT_BOOSTING:
        return _hist_boosting(model, compiled)
    learning_rate = model.learning_rate
    sources = [
        _source(estimator.tree_, learning_rate * estimator.tree_.value[:, 0, 0])
        for stage in model.estimators_
        for estimator in stage
    ]
    forest = compiled.forest
    return TreeContributions(
        PathValues.of(forest, sources),
        "raw_score",
        1.0,
        lambda payload: payload_rows(payload, forest, finite=False),
    )


def _decision_tree(model: Any) -> TreeContributions:
    classes = getattr(model, "classes_", None)
    classifier = classes is not None
    if classifier and model.n_outputs_ != 1:
        raise Unsupported("a classifier with several outputs")
    width = len(classes) if classes is not None else int(model.n_outputs_)
    builder = ForestBuilder(int(model.n_features_in_), width)
    add_tree(builder, model.tree_, classifier, width)
    forest = builder.build(width, input_dtype=np.float32)
    source = _source(model.tree_, node_values(model.tree_, classifier, width))
    return TreeContributions(
        PathValues.of(forest, [source]),
        "probability" if classifier else "value",
        1.0,
        lambda payload: payload_rows(payload, forest, finite=False),
    )


def _hist_boosting(model: Any, compiled: CompiledBoosting) -> TreeContributions:
    sources = []
    for iteration in model._predictors:
        for predictor in iteration:
            nodes = predictor.nodes
            leaf = nodes["is_leaf"].astype(bool)
            sources.append(
                SourceTree(
                    np.where(leaf, -1, nodes["left"].astype(np.int64)),
                    np.where(leaf, -1, nodes["right"].astype(np.int64)),
                    nodes["value"].astype(np.float64),
                    nodes["count"].astype(np.float64),
                )
            )
    order = None
    if compiled.preprocessor is not None:
        # The encoder puts the categorical columns first: forest feature k is input
        # column order[k].
        mask = np.asarray(model.is_categorical_, dtype=bool)
        order = np.concatenate([np.flatnonzero(mask), np.flatnonzero(~mask)])
    return TreeContributions(
        PathValues.of(compiled.forest, sources), "raw_score", 1.0, compiled.rows, order
    )


def _source(tree: Any, values: np.ndarray) -> SourceTree:
    """A scikit-learn ``Tree`` with ``values`` at its nodes."""
    return SourceTree(tree.children_left, tree.children_right, values, tree.weighted_n_node_samples)
