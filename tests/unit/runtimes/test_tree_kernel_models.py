"""LightGBM boosters and scikit-learn forests predicted by the tree kernel: the same
outputs as the library for every objective and missing-value rule the kernel takes, on
rows full of thresholds, NaN, zeros and tiny values; the library for what it does not
take, and the switch that turns it off."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest

from inferpool.runtimes.trees import forest as forest_module
from inferpool.runtimes.trees import probe_rows
from tests.support.runtimes import N_FEATURES, infer, load, save_booster, save_pickle


def awkward_rows(rng, forest, n: int = 300, nonfinite: bool = True) -> np.ndarray:
    """Rows on and next to the model's thresholds, plus NaN, zeros and tiny values."""
    rows = probe_rows(forest, np.float64, nonfinite=nonfinite, seed=int(rng.integers(1 << 30)))
    extra = rng.normal(size=(n, forest.n_features))
    if nonfinite:
        extra[rng.random(extra.shape) < 0.1] = np.nan
    extra[rng.random(extra.shape) < 0.1] = 0.0
    return np.vstack([rows, extra])


def training_data(rng, n_classes: int | None, missing: bool, zeros: bool = False):
    X = rng.normal(size=(400, N_FEATURES))
    y = X[:, 0] + X[:, 1] ** 2 - X[:, 2] + rng.normal(scale=0.2, size=len(X))
    if n_classes:
        y = np.digitize(y, np.quantile(y, np.linspace(0, 1, n_classes + 1)[1:-1]))
    if missing:
        X[rng.random(X.shape) < 0.1] = np.nan
    if zeros:
        X[rng.random(X.shape) < 0.3] = 0.0
    return X, y


LIGHTGBM_CASES = {
    "binary": ({"objective": "binary"}, 2, False, False),
    "binary-sigmoid-nan": ({"objective": "binary", "sigmoid": 0.7}, 2, True, False),
    "multiclass-nan": ({"objective": "multiclass", "num_class": 3}, 3, True, False),
    # Past eight classes numpy's sum is pairwise; LightGBM adds the classes in order.
    "multiclass-10": ({"objective": "multiclass", "num_class": 10}, 10, False, False),
    "multiclassova": ({"objective": "multiclassova", "num_class": 3}, 3, False, False),
    "regression-zero-missing": (
        {"objective": "regression", "zero_as_missing": True},
        None,
        False,
        True,
    ),
    "poisson": ({"objective": "poisson"}, None, False, False),
    "cross-entropy": ({"objective": "cross_entropy"}, 2, True, False),
    "cross-entropy-lambda": ({"objective": "cross_entropy_lambda"}, 2, False, False),
    "huber": ({"objective": "huber"}, None, True, True),
    "rf-average-output": (  # LightGBM averages predict, not raw_score
        {"boosting": "rf", "bagging_freq": 1, "bagging_fraction": 0.7, "objective": "regression"},
        None,
        False,
        False,
    ),
}


def train_lightgbm(params: dict, n_classes, missing: bool, zeros: bool, rounds: int = 15):
    import lightgbm

    rng = np.random.default_rng(3)
    X, y = training_data(rng, n_classes, missing, zeros)
    if params["objective"] == "poisson":
        y = np.exp(y / 3)
    base = {"num_leaves": 15, "verbose": -1, "num_threads": 1, "seed": 0, "min_data_in_leaf": 5}
    return lightgbm.train({**base, **params}, lightgbm.Dataset(X, y), num_boost_round=rounds)


@pytest.mark.parametrize("case", LIGHTGBM_CASES)
def test_lightgbm_outputs_match_the_library(tmp_path, case):
    params, n_classes, missing, zeros = LIGHTGBM_CASES[case]
    booster = train_lightgbm(params, n_classes, missing, zeros)
    model = load(save_booster(tmp_path / "m", booster, "model.txt"))
    compiled = model.runtime.compiled
    assert compiled is not None, model.runtime.predictor()
    assert re.fullmatch(
        r"the tree kernel \(\d+ trees, \d+ nodes, depth up to \d+\)", model.runtime.predictor()
    )
    rows = awkward_rows(np.random.default_rng(5), compiled.forest)
    # cross_entropy trains on 0/1 labels but is no classifier: it predicts probabilities.
    classes = n_classes if model.runtime.has_probabilities else None
    outputs = ["predict", "raw_score"] + (["predict_proba"] if classes else [])
    # To the bit: the same sums in the same order, and the link's exp and log1p by the C
    # library as LightGBM calls them (numpy's differ in the last bit on AVX-512 CPUs).
    for dtype in (np.float64, np.float32):
        X = rows.astype(dtype)
        out = infer(model, X, outputs)
        values = booster.predict(X)
        np.testing.assert_array_equal(out["raw_score"], booster.predict(X, raw_score=True))
        if classes == 2:
            np.testing.assert_array_equal(out["predict_proba"][:, 1], values)
            assert np.array_equal(out["predict"], (values > 0.5).astype(int))
        elif classes:
            np.testing.assert_array_equal(out["predict_proba"], values)
            assert np.array_equal(out["predict"], np.argmax(values, axis=1))
        else:
            np.testing.assert_array_equal(out["predict"], values)


def test_lightgbm_linear_trees_stay_with_the_library(tmp_path):
    import lightgbm

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    booster = lightgbm.train(
        {"objective": "regression", "linear_tree": True, "verbose": -1, "num_threads": 1},
        lightgbm.Dataset(X, 2 * X[:, 0] + X[:, 1]),
        num_boost_round=5,
    )
    model = load(save_booster(tmp_path / "m", booster, "model.txt"))
    assert model.runtime.compiled is None
    assert model.runtime.predictor() == "LightGBM, not the tree kernel: linear trees"
    np.testing.assert_allclose(infer(model, X[:10])["predict"], booster.predict(X[:10]))


def write_switch(folder, value) -> None:
    settings = {"parameters": {"extra": {"tree_kernel": value}}}
    (folder / "model-settings.json").write_text(json.dumps(settings))


def test_tree_kernel_false_keeps_the_library(tmp_path):
    booster = train_lightgbm({"objective": "binary"}, 2, False, False)
    folder = save_booster(tmp_path / "m", booster, "model.txt")
    write_switch(folder, False)
    model = load(folder)
    assert model.runtime.compiled is None
    assert model.runtime.predictor() == "LightGBM (tree_kernel is off)"


def test_a_tree_kernel_setting_that_is_not_a_boolean_fails_the_load(tmp_path):
    booster = train_lightgbm({"objective": "binary"}, 2, False, False)
    folder = save_booster(tmp_path / "m", booster, "model.txt")
    write_switch(folder, "yes")
    with pytest.raises(ValueError, match="tree_kernel must be true or false"):
        load(folder)


def test_a_compiled_model_that_disagrees_with_the_library_is_not_used(
    tmp_path, monkeypatch, caplog
):
    from inferpool.runtimes.trees import from_lightgbm

    booster = train_lightgbm({"objective": "binary"}, 2, False, False)
    # A wrong link function: the probe rows must catch it.
    monkeypatch.setattr(from_lightgbm, "_link", lambda objective, n: lambda raw: raw)
    model = load(save_booster(tmp_path / "m", booster, "model.txt"))
    assert model.runtime.compiled is None
    assert model.runtime.predictor().endswith("predict differs from the library's on probe rows")
    X = np.random.default_rng(0).normal(size=(5, N_FEATURES))
    np.testing.assert_allclose(
        infer(model, X, ["predict_proba"])["predict_proba"][:, 1], booster.predict(X)
    )


def test_an_importer_crash_leaves_the_model_to_the_library(tmp_path, monkeypatch, caplog):
    from inferpool.runtimes.trees import from_lightgbm

    def broken(self, booster):
        raise KeyError("tree_info")

    monkeypatch.setattr(from_lightgbm.CompiledLightGBM, "__init__", broken)
    booster = train_lightgbm({"objective": "binary"}, 2, False, False)
    with caplog.at_level(logging.WARNING, logger="inferpool.runtimes.trees"):
        model = load(save_booster(tmp_path / "m", booster, "model.txt"))
    assert model.runtime.compiled is None
    assert "could not take it: KeyError: 'tree_info'" in model.runtime.predictor()
    assert "tree kernel import failed" in caplog.text  # with the traceback, for a bug report


def test_without_the_built_kernel_lightgbm_predicts_as_before(tmp_path, monkeypatch):
    monkeypatch.setattr(forest_module, "_kernel", None)
    booster = train_lightgbm({"objective": "binary"}, 2, False, False)
    model = load(save_booster(tmp_path / "m", booster, "model.txt"))
    assert model.runtime.compiled is None
    X = np.random.default_rng(0).normal(size=(5, N_FEATURES))
    np.testing.assert_allclose(
        infer(model, X, ["raw_score"])["raw_score"], booster.predict(X, raw_score=True)
    )


def sklearn_forest(kind: str, missing: bool = False):
    from sklearn.ensemble import (
        ExtraTreesClassifier,
        ExtraTreesRegressor,
        RandomForestClassifier,
        RandomForestRegressor,
    )

    rng = np.random.default_rng(11)
    classifier = kind.endswith("classifier")
    X, y = training_data(rng, 3 if classifier else None, missing)
    if kind == "rf-classifier":
        model = RandomForestClassifier(n_estimators=12, max_depth=8, random_state=0)
        y = np.array(["setosa", "versicolor", "virginica"])[y]
    elif kind == "et-classifier":
        model = ExtraTreesClassifier(n_estimators=12, random_state=0)
    elif kind == "rf-regressor":
        model = RandomForestRegressor(n_estimators=12, max_depth=10, random_state=0)
    else:
        model = ExtraTreesRegressor(n_estimators=8, random_state=0)
        y = np.column_stack([y, -2 * y])  # two targets
    return model.fit(X, y), X


@pytest.mark.parametrize("kind", ["rf-classifier", "et-classifier", "rf-regressor", "et-regressor"])
def test_sklearn_forests_match_the_library(tmp_path, kind):
    estimator, _ = sklearn_forest(kind)
    model = load(save_pickle(tmp_path / "m", estimator))
    compiled = model.runtime.compiled
    assert compiled is not None, "the kernel should take this forest"
    rng = np.random.default_rng(2)
    rows = awkward_rows(rng, compiled.forest, nonfinite=False)
    outputs = ["predict", "predict_proba"] if kind.endswith("classifier") else ["predict"]
    for dtype in (np.float64, np.float32):
        X = rows.astype(dtype)
        out = infer(model, X, outputs)
        assert np.array_equal(out["predict"], estimator.predict(X))
        if "predict_proba" in outputs:
            np.testing.assert_allclose(out["predict_proba"], estimator.predict_proba(X), rtol=1e-12)


def test_a_forest_fitted_with_missing_values_sends_nan_rows_to_scikit_learn(tmp_path):
    estimator, _ = sklearn_forest("rf-classifier", missing=True)
    model = load(save_pickle(tmp_path / "m", estimator))
    compiled = model.runtime.compiled
    assert compiled is not None
    rng = np.random.default_rng(4)
    X = awkward_rows(rng, compiled.forest, nonfinite=False)
    X[rng.random(X.shape) < 0.05] = np.nan
    assert compiled.rows(X) is None  # not finite: scikit-learn predicts these
    out = infer(model, X, ["predict", "predict_proba"])
    assert np.array_equal(out["predict"], estimator.predict(X))
    np.testing.assert_allclose(out["predict_proba"], estimator.predict_proba(X), rtol=1e-12)


def test_other_estimators_are_not_compiled(tmp_path):
    from sklearn.ensemble import AdaBoostClassifier

    X, y = training_data(np.random.default_rng(0), 2, False)
    model = load(save_pickle(tmp_path / "m", AdaBoostClassifier(n_estimators=5).fit(X, y)))
    assert model.runtime.compiled is None


XGBOOST_CASES = {
    "binary-logistic-nan": ({"objective": "binary:logistic"}, 2, True),
    "logitraw": ({"objective": "binary:logitraw"}, 2, False),
    "hinge": ({"objective": "binary:hinge"}, 2, False),
    "softprob": ({"objective": "multi:softprob", "num_class": 3}, 3, True),
    "softmax": ({"objective": "multi:softmax", "num_class": 3}, 3, False),
    "squarederror-nan": ({"objective": "reg:squarederror"}, None, True),
    "poisson": ({"objective": "count:poisson"}, None, False),
    "two-targets": ({"objective": "reg:squarederror"}, "two", False),
}


def train_xgboost(params: dict, n_classes, missing: bool, rounds: int = 15):
    import xgboost

    rng = np.random.default_rng(9)
    X, y = training_data(rng, n_classes if isinstance(n_classes, int) else None, missing)
    if params["objective"] == "count:poisson":
        y = np.exp(y / 3)
    if n_classes == "two":
        y = np.column_stack([y, -y])
    base = {"max_depth": 5, "nthread": 1, "seed": 0}
    return xgboost.train({**base, **params}, xgboost.DMatrix(X, y), num_boost_round=rounds)


@pytest.mark.parametrize("case", XGBOOST_CASES)
def test_xgboost_outputs_match_the_library(tmp_path, case):
    params, n_classes, missing = XGBOOST_CASES[case]
    booster = train_xgboost(params, n_classes, missing)
    model = load(save_booster(tmp_path / "m", booster, "model.json"))
    compiled = model.runtime.compiled
    assert compiled is not None, model.runtime.predictor()
    rows = awkward_rows(np.random.default_rng(6), compiled.forest)
    for dtype in (np.float64, np.float32):
        X = rows.astype(dtype)
        out = infer(model, X, ["margin", "predict"])
        # The margins are summed in float32 in XGBoost's order: equal to the bit.
        assert np.array_equal(out["margin"], booster.inplace_predict(X, predict_type="margin"))
        values = booster.inplace_predict(X)
        if model.runtime.has_probabilities and n_classes == 2:
            assert np.array_equal(out["predict"], (values > 0.5).astype(int))
        elif model.runtime.has_probabilities:
            assert np.array_equal(out["predict"], np.argmax(values, axis=1))
        elif model.runtime.classes is not None:
            assert np.array_equal(out["predict"], values.astype(int))
        else:  # a link function's last bit may differ (numpy's exp against XGBoost's)
            np.testing.assert_allclose(out["predict"], values, rtol=1e-6)


def test_an_early_stopped_xgboost_classifier_uses_its_best_iterations(tmp_path):
    import xgboost

    rng = np.random.default_rng(1)
    X, y = training_data(rng, 2, False)
    estimator = xgboost.XGBClassifier(
        n_estimators=200, max_depth=4, n_jobs=1, early_stopping_rounds=3, learning_rate=0.5
    )
    estimator.fit(X[:300], y[:300], eval_set=[(X[300:], y[300:])], verbose=False)
    assert estimator.best_iteration < 199
    model = load(save_pickle(tmp_path / "m", estimator))
    assert model.runtime.compiled is not None, model.runtime.predictor()
    out = infer(model, X, ["predict_proba", "margin"])
    np.testing.assert_allclose(out["predict_proba"], estimator.predict_proba(X), atol=1e-6)
    assert np.array_equal(out["margin"], estimator.predict(X, output_margin=True))


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"booster": "dart", "objective": "binary:logistic"}, "the dart booster"),
        ({"objective": "survival:cox"}, "objective 'survival:cox'"),
    ],
)
def test_xgboost_models_the_kernel_does_not_take_stay_with_xgboost(tmp_path, params, reason):
    booster = train_xgboost(params, 2, False, rounds=3)
    model = load(save_booster(tmp_path / "m", booster, "model.json"))
    assert model.runtime.compiled is None
    assert model.runtime.predictor() == f"XGBoost, not the tree kernel: {reason}"


def test_an_xgboost_model_with_another_missing_marker_stays_with_xgboost(tmp_path):
    import xgboost

    X, y = training_data(np.random.default_rng(0), 2, False)
    estimator = xgboost.XGBClassifier(n_estimators=3, n_jobs=1, missing=0.0).fit(X, y)
    model = load(save_pickle(tmp_path / "m", estimator))
    assert model.runtime.predictor() == (
        "XGBoost, not the tree kernel: missing-value marker 0.0 (the kernel takes NaN)"
    )
    np.testing.assert_allclose(
        infer(model, X, ["predict_proba"])["predict_proba"], estimator.predict_proba(X)
    )


def test_a_forest_fitted_on_a_dataframe_is_compiled_and_matches(tmp_path):
    import pandas as pd
    from sklearn.ensemble import RandomForestClassifier

    X, y = training_data(np.random.default_rng(8), 3, False)
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(N_FEATURES)])
    estimator = RandomForestClassifier(n_estimators=10, random_state=0).fit(frame, y)
    model = load(save_pickle(tmp_path / "m", estimator))
    assert model.runtime.compiled is not None, model.runtime.predictor()
    rows = np.random.default_rng(9).normal(size=(50, N_FEATURES))
    out = infer(model, rows, ["predict", "predict_proba"])
    expected = pd.DataFrame(rows, columns=frame.columns)
    assert np.array_equal(out["predict"], estimator.predict(expected))
    np.testing.assert_allclose(out["predict_proba"], estimator.predict_proba(expected), rtol=1e-12)
