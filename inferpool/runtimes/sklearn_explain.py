"""Explanations of scikit-learn models (``Runtime.explain`` of ``runtimes/sklearn.py``):
Saabas contributions of tree models (``trees/sklearn_contributions.py``) and coefficient
contributions of linear models and their pipelines (``linear_contributions.py``).

Built on a model's first explanation, from the kernel's compiled model when it predicts,
else compiled for explaining alone; a model neither covers cannot explain, and says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from inferpool.runtimes.explain import Attributions, CannotExplain
from inferpool.runtimes.linear import CompiledLinear, is_linear
from inferpool.runtimes.linear_contributions import linear_contributions
from inferpool.runtimes.trees.forest import Unsupported
from inferpool.runtimes.trees.sklearn_contributions import explains_trees, tree_contributions

WHAT_EXPLAINS = (
    "inferpool explains scikit-learn's forests, decision trees, gradient boosting and "
    "linear models (alone or after StandardScaler, MinMaxScaler or OneHotEncoder)"
)


class SKLearnExplainer:
    """Contributions of one fitted scikit-learn model, from the payload ``predict`` takes."""

    def __init__(self, model: Any, compiled: Any, feature_names: list[str] | None) -> None:
        self.feature_names = feature_names
        self.classes = getattr(model, "classes_", None)
        self._contributions: Callable[[Any], np.ndarray | None]
        try:
            if explains_trees(model):
                trees = tree_contributions(model, compiled)
                self.score = trees.score
                self._contributions = trees.of
            elif is_linear(model):
                linear = compiled if isinstance(compiled, CompiledLinear) else CompiledLinear(model)
                self.score = "decision_function" if linear.classes is not None else "value"
                self._contributions = lambda payload: linear_contributions(linear, payload)
            else:
                raise CannotExplain(f"{type(model).__name__} has no explainer: {WHAT_EXPLAINS}")
        except Unsupported as exc:
            raise CannotExplain(f"{type(model).__name__}: {exc}") from None

    def explain(self, payload: Any) -> Attributions:
        values = self._contributions(payload)
        if values is None:
            raise CannotExplain(
                "its explanation needs every feature as a number (and every category one "
                "the model knows)"
            )
        return Attributions.of(values, self.score, self.feature_names, self.classes)
