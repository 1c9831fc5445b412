"""CatBoost's oblivious trees in the tree kernel, without a server: for each objective
(binary, multi-class, one-vs-all, regression, Poisson, multi-target, ranking) and each NaN
mode, the kernel serves and every output is CatBoost's within float tolerance, for
float32 and float64 rows with NaN, in one block, row by row and split between threads;
what the kernel does not reproduce keeps CatBoost, and the load says why."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from inferpool.runtimes.trees import _kernel
from inferpool.runtimes.trees import from_catboost as fc
from inferpool.settings import ModelSettings
from tests.runtimes import catboost_models as cm

catboost = pytest.importorskip("catboost")

OUTPUTS = {
    "classifier": ["predict", "predict_proba", "raw_formula_val"],
    "other": ["predict", "raw_formula_val"],
}


def runtime_of(model: Any, **extra: Any) -> Any:
    from inferpool.runtimes.catboost import CatBoostRuntime  # imports catboost

    runtime = CatBoostRuntime(ModelSettings(name="m", parameters={"extra": extra}))
    runtime.adopt(model)
    return runtime


def regressor_with_nan(loss: str, targets: int = 1, ranker: bool = False) -> Any:
    data = cm.rows_with_nan(300, 6, seed=8)
    clean = np.nan_to_num(data)
    target = clean[:, :targets] @ np.ones(targets) if targets == 1 else clean[:, :targets]
    if loss == "Poisson":
        target = np.random.default_rng(2).poisson(np.exp(0.3 * clean[:, 0]))
    options = {**cm.TRAINING, "iterations": 30, "depth": 6, "loss_function": loss}
    if ranker:
        return catboost.CatBoostRanker(**options).fit(data, target, group_id=np.arange(300) // 10)
    return catboost.CatBoostRegressor(**options).fit(data, target)


MODELS = {
    "logloss-min": lambda: cm.nan_classifier("Logloss"),
    "logloss-max": lambda: cm.nan_classifier("Logloss", nan_mode="Max"),
    "crossentropy": lambda: cm.nan_classifier("CrossEntropy"),
    "multiclass-min": lambda: cm.nan_classifier(),
    "multiclass-max": lambda: cm.nan_classifier(nan_mode="Max"),
    "one-vs-all": lambda: cm.nan_classifier("MultiClassOneVsAll", depth=4),
    "rmse": lambda: regressor_with_nan("RMSE"),
    "poisson": lambda: regressor_with_nan("Poisson"),
    "multi-rmse": lambda: regressor_with_nan("MultiRMSE", targets=2),
    "ranker": lambda: regressor_with_nan("YetiRank", ranker=True),
}


@pytest.mark.parametrize("kind", list(MODELS))
def test_every_objective_is_served_by_the_kernel_as_catboost_answers(kind: str) -> None:
    model = MODELS[kind]()
    runtime = runtime_of(model)
    assert runtime.predicted_by.startswith("the tree kernel (30 oblivious trees"), (
        runtime.predicted_by
    )
    names = OUTPUTS["classifier" if runtime.classes is not None else "other"]
    library = runtime_of(model, tree_kernel=False)
    assert library.compiled is None
    rows = cm.rows_with_nan(300, 6, seed=9)
    rows[::7, 2] = np.inf
    for matrix in (rows, rows.astype(np.float32), rows[:3], rows[:1]):
        ours, theirs = runtime.predict(matrix, names), library.predict(matrix, names)
        for name in names:
            if ours[name].dtype.kind in "fc":  # CatBoost's exp: a few ulps off the C library's
                np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-12, err_msg=name)
            else:
                assert ours[name].tolist() == theirs[name].tolist(), name


def test_a_batch_split_between_threads_sums_as_one_thread() -> None:
    runtime = runtime_of(cm.nan_classifier())
    assert runtime.compiled is not None
    forest = runtime.compiled.forest
    rows = cm.rows_with_nan(5000, 6, seed=10)
    one, four = forest.accumulate(rows, threads=1), forest.accumulate(rows, threads=4)
    assert np.array_equal(one, four)
    assert np.array_equal(forest.accumulate(rows[:2], threads=1), one[:2])  # row by row


def test_what_the_kernel_does_not_reproduce_keeps_catboost() -> None:
    categorical = runtime_of(cm.categorical_classifier())
    assert categorical.compiled is None
    assert categorical.predicted_by == "CatBoost, not the tree kernel: categorical features"
    data = cm.numeric_rows(200, 4)
    options = {**cm.TRAINING, "grow_policy": "Depthwise"}
    depthwise = runtime_of(catboost.CatBoostRegressor(**options).fit(data, data[:, 0]))
    assert depthwise.compiled is None
    assert "not the tree kernel: trees that are not symmetric" in depthwise.predicted_by
    off = runtime_of(cm.regressor(), tree_kernel=False)
    assert (off.compiled, off.predicted_by) == (None, "CatBoost (tree_kernel is off)")


def test_a_text_feature_keeps_catboost() -> None:
    exported = fc.model_json(cm.regressor())
    exported["features_info"]["text_features"] = [{"feature_id": "review"}]
    with pytest.raises(fc.Unsupported, match="text features"):
        fc.CompiledCatBoost(exported, None, 4)


def test_a_kernel_that_answers_otherwise_keeps_catboost(monkeypatch: pytest.MonkeyPatch) -> None:
    model = cm.regressor()
    exported = fc.model_json(model)
    exported["oblivious_trees"][3]["leaf_values"][5] += 1e-6  # one leaf of one tree
    monkeypatch.setattr(fc, "model_json", lambda _: exported)
    monkeypatch.setattr("inferpool.runtimes.catboost.model_json", lambda _: exported)
    runtime = runtime_of(model)
    assert runtime.compiled is None
    assert runtime.predicted_by == (
        "CatBoost, not the tree kernel: predict differs from the library's on probe rows"
    )
    rows = cm.numeric_rows(4, 4)
    np.testing.assert_array_equal(
        runtime.predict(rows, ["predict"])["predict"], model.predict(rows)
    )


def test_the_kernel_refuses_a_layout_that_reads_outside_its_arrays() -> None:
    forest = runtime_of(cm.regressor()).compiled.forest  # type: ignore[union-attr]
    x = np.zeros((2, forest.n_features), np.float32)
    out = np.zeros((2, 1))
    splits = forest.splits.copy()
    splits["feature"][0] = forest.n_features  # a column x does not have
    trees = forest.trees.copy()
    trees["leaf"][-1] += 1  # past the last leaf
    for bad_splits, bad_trees in ((splits, forest.trees), (forest.splits, trees)):
        with pytest.raises(ValueError, match="inconsistent oblivious forest layout"):
            _kernel.oblivious(bad_splits, bad_trees, forest.leaves, 1, forest.n_features, x, out)
    with pytest.raises(ValueError, match="float32"):
        _kernel.oblivious(forest.splits, forest.trees, forest.leaves, 1, forest.n_features,
                          x.astype(np.float64), out)  # fmt: skip
