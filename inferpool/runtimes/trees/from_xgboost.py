"""An XGBoost gbtree Booster for the kernel: its trees from the JSON model, summed in
float32 from the base margin and passed through the objective's link, as XGBoost does.

XGBoost's split, reproduced: the feature as float32; a NaN follows ``default_left``;
otherwise ``x < split_condition`` goes left, which for float32 values is
``x <= the float32 just below split_condition``. Categorical splits, vector leaves, DART,
linear boosters and a missing-value marker other than NaN are not reproduced.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from inferpool.runtimes.trees.forest import (
    NAN_LEFT,
    Forest,
    ForestBuilder,
    NodeArrays,
    Unsupported,
    softmax,
)

F32 = np.float32
IDENTITY_OBJECTIVES = {
    "reg:squarederror",
    "reg:squaredlogerror",
    "reg:pseudohubererror",
    "reg:absoluteerror",
    "reg:quantileerror",
    "binary:logitraw",
    "rank:pairwise",
    "rank:ndcg",
    "rank:map",
}
LOGISTIC_OBJECTIVES = {"binary:logistic", "reg:logistic"}
EXP_OBJECTIVES = {"count:poisson", "reg:gamma", "reg:tweedie"}
SOFTMAX_OBJECTIVES = {"multi:softprob", "multi:softmax"}


class CompiledXGBoost:
    """``values`` and ``margin`` of a Booster as ``inplace_predict`` gives them."""

    def __init__(self, booster: Any, predict_params: dict[str, Any]) -> None:
        missing = predict_params.get("missing", np.nan)
        if missing is not None and not np.isnan(missing):
            raise Unsupported(f"missing-value marker {missing!r} (the kernel takes NaN)")
        learner = json.loads(bytes(booster.save_raw("json")))["learner"]
        booster_kind = learner["gradient_booster"]["name"]
        if booster_kind != "gbtree":
            raise Unsupported(f"the {booster_kind} booster")
        model = learner["gradient_booster"]["model"]
        trees, groups = model["trees"], model["tree_info"]
        iterations = predict_params.get("iteration_range", (0, 0))
        if tuple(iterations) != (0, 0):
            indptr = model.get("iteration_indptr")
            if indptr is None or iterations[0] != 0:
                raise Unsupported(f"iteration range {iterations}")
            trees, groups = trees[: indptr[iterations[1]]], groups[: indptr[iterations[1]]]
        self.objective = learner["objective"]["name"]
        parameters = learner["learner_model_param"]
        self.n_classes = int(parameters.get("num_class", 0))
        self.n_columns = max(self.n_classes, int(parameters.get("num_target", 1)), 1)
        builder = ForestBuilder(int(parameters["num_feature"]))
        for tree, group in zip(trees, groups, strict=True):
            if int(tree["tree_param"].get("size_leaf_vector", "1")) > 1:
                raise Unsupported("vector leaves (multi_output_tree)")
            if any(tree["split_type"]):
                raise Unsupported("categorical splits")
            builder.add_arrays(*_tree_arrays(tree), column=int(group), weights=_cover(tree))
        self.link = _link(self.objective)
        base = _base_margin(self.objective, parameters["base_score"], self.n_columns)
        self.forest: Forest = builder.build(
            self.n_columns, input_dtype=F32, sum_dtype=F32, start=base
        )

    def margin(self, matrix: np.ndarray) -> np.ndarray:
        return self.forest.scores(matrix)

    def values(self, matrix: np.ndarray) -> np.ndarray:
        return self.link(self.forest.scores(matrix))


def _tree_arrays(tree: dict[str, Any]) -> NodeArrays:
    """The tree's node arrays as ``ForestBuilder.add_arrays`` takes them (no column)."""
    left = np.asarray(tree["left_children"], dtype=np.int64)
    # A leaf's value and a split's condition share the array, as float32 in XGBoost.
    conditions = np.asarray(tree["split_conditions"], dtype=F32)
    leaf = left == -1
    below = np.nextafter(conditions, F32(-np.inf)).astype(np.float64)
    flags = np.where(np.asarray(tree["default_left"], dtype=bool), NAN_LEFT, 0)
    return (
        left,
        np.asarray(tree["right_children"], dtype=np.int64),
        np.where(leaf, 0, np.asarray(tree["split_indices"], dtype=np.int64)),
        np.where(leaf, 0.0, below),
        flags.astype(np.uint32),
        np.where(leaf, conditions.astype(np.float64), 0.0),
    )


def _cover(tree: dict[str, Any]) -> np.ndarray | None:
    """Each node's cover (the hessian of the training rows that reached it), if saved."""
    cover = tree.get("sum_hessian")
    return None if cover is None else np.asarray(cover, dtype=np.float64)


def _base_margin(objective: str, base_score: str, n_columns: int) -> np.ndarray:
    """XGBoost's base_score (stored as a prediction: estimated from the training labels
    since XGBoost 2.0, one per class or target since 3.1) turned into a margin, in
    float32 as XGBoost's ``ProbToMargin`` computes it."""
    values = [F32(v) for v in base_score.strip("[]").split(",") if v.strip()]
    score = np.array(values if len(values) > 1 else values * n_columns, dtype=F32)
    if objective in LOGISTIC_OBJECTIVES:
        # 1/p - 1 in float32 arithmetic, as XGBoost's C++ does, then its logf.
        return -_logf(F32(1.0) / score - F32(1.0))
    if objective in EXP_OBJECTIVES:
        return _logf(score)
    return score


def _logf(values: np.ndarray) -> np.ndarray:
    """The C library's ``logf``, which XGBoost calls. numpy's float32 log (its own SIMD
    approximation) and a float64 log rounded to float32 are each one ulp off it for some
    values, and a base margin one ulp off the library's shifts every prediction of the
    model (a default model estimates its base_score from the labels: any value occurs)."""
    logf = _libm_logf()
    if logf is None:  # no C library to ask: the correctly rounded value is nearly always it
        return np.log(values.astype(np.float64)).astype(F32)
    return np.array([logf(float(v)) for v in values], dtype=F32)


@functools.cache
def _libm_logf() -> Callable[[float], float] | None:
    name = ctypes.util.find_library("m")
    try:
        logf = ctypes.CDLL(name).logf if name else None
    except (OSError, AttributeError):
        return None
    if logf is not None:
        logf.restype, logf.argtypes = ctypes.c_float, [ctypes.c_float]
    return logf


def _link(objective: str) -> Callable[[np.ndarray], np.ndarray]:
    """XGBoost's PredTransform for the objective, in float32."""
    if objective in IDENTITY_OBJECTIVES:
        return lambda margin: margin
    if objective in LOGISTIC_OBJECTIVES:
        return lambda margin: F32(1.0) / (F32(1.0) + np.exp(-margin))
    if objective in EXP_OBJECTIVES:
        return np.exp
    if objective == "multi:softprob":
        return softmax
    if objective == "multi:softmax":
        return lambda margin: np.argmax(margin, axis=1).astype(F32)
    if objective == "binary:hinge":
        return lambda margin: (margin > 0).astype(F32)
    raise Unsupported(f"objective {objective!r}")
