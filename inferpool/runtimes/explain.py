"""Explanations: per-feature attributions of a model's score, as one V2 output.

A runtime that can explain implements ``Runtime.explain(payload)`` (the payload its
``predict`` takes) and returns ``Attributions``; one that cannot raises ``CannotExplain``
with the reason. The engine (``engine/worker/explain.py``) answers it as a V2 response
with one output, ``contributions`` (FP64):

- ``[rows, features + 1]`` for a regressor of one target or a binary classifier, and
  ``[rows, classes (or targets), features + 1]`` otherwise;
- the last entry of each row (per class) is the bias (the expected value: LightGBM's and
  XGBoost's layout); the features' entries plus the bias add up to the score the output's
  ``parameters.score`` names: ``raw_score`` (a boosted model's margin, the log-odds of a
  binary classifier), ``probability`` (a forest's or decision tree's class probability:
  of ``parameters.positive_class`` for a binary classifier), ``decision_function`` (a
  linear classifier's) or ``value`` (a regressor's prediction);
- ``parameters.feature_names`` names the features when the model knows them,
  ``parameters.class_labels`` the classes of a classifier (the class axis's order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inferpool.errors import BadRequest
from inferpool.protocol.types import Tensor

OUTPUT = "contributions"
# The scores a binary classifier's contributions are of the positive class alone.
PER_CLASS_SCORES = ("probability",)


class CannotExplain(BadRequest):
    """The model has no explanation for this request; the message says why."""


@dataclass(frozen=True)
class Attributions:
    """Contributions of one request's rows, in the layout the module's docstring gives."""

    values: np.ndarray
    score: str
    feature_names: list[str] | None = None
    class_labels: list[Any] | None = None

    @classmethod
    def of(
        cls,
        values: np.ndarray,
        score: str,
        feature_names: list[str] | None = None,
        classes: Any = None,
    ) -> Attributions:
        """From ``values`` of rows x score columns x (features + 1): one score column
        becomes ``[rows, features + 1]``, and a binary classifier's two class-probability
        columns the positive class's."""
        if values.ndim == 2:
            values = values[:, np.newaxis, :]
        labels = np.asarray(classes).tolist() if classes is not None else None
        binary = labels is not None and len(labels) == 2 and values.shape[1] == 2
        if binary and score in PER_CLASS_SCORES:
            values = values[:, 1:, :]
        if values.shape[1] == 1:
            values = values[:, 0, :]
        return cls(np.ascontiguousarray(values, np.float64), score, feature_names, labels)

    def tensor(self, name: str = OUTPUT) -> Tensor:
        """The V2 output: FP64 data, what it explains in its parameters."""
        parameters: dict[str, Any] = {"score": self.score}
        if self.feature_names is not None:
            parameters["feature_names"] = list(self.feature_names)
        if self.class_labels is not None:
            parameters["class_labels"] = self.class_labels
            if self.values.ndim == 2 and len(self.class_labels) == 2:
                parameters["positive_class"] = self.class_labels[1]
        return Tensor(name, "FP64", tuple(self.values.shape), self.values, parameters)
