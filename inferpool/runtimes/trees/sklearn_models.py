"""Which scikit-learn estimators the tree kernel takes, and the compiled model of each:
random forests and extra-trees (``from_sklearn``), gradient boosting and
histogram-based gradient boosting (``from_sklearn_boosting``)."""

from __future__ import annotations

from typing import Any

from inferpool.runtimes.trees.from_sklearn import CompiledSKLearnForest, is_forest
from inferpool.runtimes.trees.from_sklearn_boosting import CompiledBoosting, is_boosting

CompiledSKLearn = CompiledSKLearnForest | CompiledBoosting


def is_tree_model(model: Any) -> bool:
    """Whether the tree kernel may take ``model`` (it is one of the estimators above)."""
    return is_forest(model) or is_boosting(model)


def compile_sklearn(model: Any) -> CompiledSKLearn:
    """The compiled model for a scikit-learn tree model (``Unsupported`` if it has
    something the kernel does not reproduce)."""
    if is_boosting(model):
        return CompiledBoosting(model)
    return CompiledSKLearnForest(model)
