"""A LightGBM Booster for the kernel: its trees from ``dump_model()``, its objective's
link function applied to the summed scores as LightGBM does.

LightGBM's numerical split, reproduced: LightGBM drops every |x| <= 1e-35 from a row
before it predicts, so such a value counts as 0.0; a NaN becomes 0.0 unless the missing type is
"NaN"; a missing value (NaN for type "NaN", |x| <= 1e-35 for type "Zero") follows
``default_left``; any other value goes left when ``x <= threshold`` in double precision.

LightGBM's categorical split (``decision_type`` "==", its categories as "1||3||5"),
reproduced: NaN goes right; any other value is truncated to an integer, which goes left
when it is one of the categories, right when it is another, negative (from -1.0 down) or
past 2^31 - 1. Linear trees are not reproduced (``Unsupported``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from inferpool.runtimes.trees.forest import (
    Forest,
    ForestBuilder,
    Split,
    Unsupported,
    libm_exp,
    libm_log1p,
    libm_sigmoid,
    softmax_in_order,
)

IDENTITY_OBJECTIVES = {
    "regression",
    "regression_l1",
    "huber",
    "fair",
    "quantile",
    "mape",
    "lambdarank",
    "rank_xendcg",
}
EXP_OBJECTIVES = {"poisson", "gamma", "tweedie"}


class CompiledLightGBM:
    """``values`` and ``margin`` of a Booster, shaped as ``Booster.predict`` shapes them."""

    def __init__(self, booster: Any) -> None:
        dump = booster.dump_model()
        self.n_columns = int(dump.get("num_tree_per_iteration", 1))
        builder = ForestBuilder(int(dump["max_feature_idx"]) + 1)
        trees = dump["tree_info"]
        for index, tree in enumerate(trees):
            builder.add_tree(
                tree["tree_structure"], _describe, index % self.n_columns, weigh=_count
            )
        self.forest: Forest = builder.build(self.n_columns)
        # LightGBM divides an averaging model's (rf) sums by the iterations.
        self.iterations = max(1, len(trees) // self.n_columns) if dump.get("average_output") else 1
        self.link = _link(str(dump.get("objective", "")), self.n_columns)

    def margin(self, matrix: np.ndarray) -> np.ndarray:
        # LightGBM's raw score is the plain sum, even for a model that averages (rf).
        return self.forest.scores(matrix)

    def values(self, matrix: np.ndarray) -> np.ndarray:
        raw = self.forest.scores(matrix)
        if self.iterations != 1:
            raw /= self.iterations
        return self.link(raw)


def _count(node: dict[str, Any]) -> float:
    """The training rows that reached the node (NaN when the dump does not say)."""
    return float(node.get("internal_count", node.get("leaf_count", "nan")))


def _describe(node: dict[str, Any]) -> Split | float:
    if "split_feature" not in node:
        if "leaf_coeff" in node:
            raise Unsupported("linear trees")
        return float(node["leaf_value"])
    decision = node.get("decision_type", "<=")
    if decision == "==":
        return Split(
            feature=int(node["split_feature"]),
            threshold=0.0,
            left=node["left_child"],
            right=node["right_child"],
            nan_left=False,
            categories=[int(c) for c in str(node["threshold"]).split("||")],
        )
    if decision != "<=":
        raise Unsupported(f"decision type {decision!r}")
    missing = node.get("missing_type", "None")
    default_left = bool(node.get("default_left", False))
    threshold = float(node["threshold"])
    if missing == "NaN":
        nan_left, zero_missing = default_left, False
    elif missing == "Zero":
        nan_left, zero_missing = default_left, True
    elif missing == "None":
        nan_left, zero_missing = threshold >= 0.0, False
    else:
        raise Unsupported(f"missing type {missing!r}")
    return Split(
        feature=int(node["split_feature"]),
        threshold=threshold,
        left=node["left_child"],
        right=node["right_child"],
        nan_left=nan_left,
        zero_missing=zero_missing,
        zero_right=not default_left,
        zero_snap=True,
    )


def _link(objective: str, n_columns: int) -> Callable[[np.ndarray], np.ndarray]:
    """LightGBM's ConvertOutput for the objective named in the model, to the bit: the same
    operations in the same order, exp and log1p by the C library (as LightGBM calls them)."""
    name, *options = objective.split()
    settings = dict(option.partition(":")[::2] for option in options)
    if name in IDENTITY_OBJECTIVES and "sqrt" not in settings:
        return lambda raw: raw
    if name in EXP_OBJECTIVES:
        return libm_exp
    if name in ("binary", "multiclassova", "cross_entropy"):
        # cross_entropy has no sigmoid option: its scale is 1.0, and -1.0 * raw is -raw.
        scale = float(settings.get("sigmoid", 1.0))
        return functools.partial(libm_sigmoid, scale=scale)
    if name == "cross_entropy_lambda":
        return lambda raw: libm_log1p(libm_exp(raw))
    if name == "multiclass" and n_columns > 1:
        return softmax_in_order
    raise Unsupported(f"objective {objective!r}")
