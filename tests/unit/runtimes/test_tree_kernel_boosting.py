"""scikit-learn's GradientBoosting and HistGradientBoosting predicted by the tree kernel:
every output (predict, predict_proba, decision_function) equal to scikit-learn's to the
bit, for binary, multi-class and regression models, HistGradientBoosting on rows with
NaN and infinities; a model with categorical features stays with scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest

from inferpool.runtimes.trees.from_sklearn_boosting import CompiledBoosting
from tests.support.runtimes import N_FEATURES, infer, load, save_pickle
from tests.unit.runtimes.test_tree_kernel_models import awkward_rows

LABELS = np.array(["low", "middle", "high"])


def training_data(rng, missing: bool):
    X = rng.normal(size=(600, N_FEATURES))
    y = X[:, 0] + X[:, 1] ** 2 - X[:, 2] + rng.normal(scale=0.2, size=len(X))
    if missing:
        X[rng.random(X.shape) < 0.1] = np.nan
    return X, y


def fitted(kind: str):
    """A fitted model of ``kind``: "<estimator>-<task>"."""
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        GradientBoostingRegressor,
        HistGradientBoostingClassifier,
        HistGradientBoostingRegressor,
    )

    estimator, task = kind.split("-", 1)
    hist = estimator == "hgb"
    X, y = training_data(np.random.default_rng(13), missing=hist)
    if task == "binary":
        target = np.where(y > 1.0, "yes", "no")
    elif task == "multiclass":
        target = LABELS[np.digitize(y, [0.0, 1.5])]
    elif task == "poisson":
        target = np.exp(y / 3)
    else:
        target = y
    if hist:
        options = {"max_iter": 25, "random_state": 0}
        if task == "poisson":
            return HistGradientBoostingRegressor(loss="poisson", **options).fit(X, target), X
        if task in ("binary", "multiclass"):
            return HistGradientBoostingClassifier(**options).fit(X, target), X
        return HistGradientBoostingRegressor(**options).fit(X, target), X
    options = {"n_estimators": 25, "max_depth": 4, "random_state": 0}
    if task in ("binary", "multiclass"):
        return GradientBoostingClassifier(**options).fit(X, target), X
    if task == "huber-zero-init":
        return GradientBoostingRegressor(loss="huber", init="zero", **options).fit(X, target), X
    return GradientBoostingRegressor(**options).fit(X, target), X


KINDS = [
    "gb-binary",
    "gb-multiclass",
    "gb-regression",
    "gb-huber-zero-init",
    "hgb-binary",
    "hgb-multiclass",
    "hgb-regression",
    "hgb-poisson",
]


@pytest.mark.parametrize("kind", KINDS)
def test_every_output_matches_scikit_learn_to_the_bit(tmp_path, kind):
    estimator, _ = fitted(kind)
    model = load(save_pickle(tmp_path / "m", estimator))
    compiled = model.runtime.compiled
    assert compiled is not None, model.runtime.predictor()
    assert model.runtime.predictor().startswith("the tree kernel (")
    hist = kind.startswith("hgb")
    rows = awkward_rows(np.random.default_rng(8), compiled.forest, nonfinite=hist)
    classifier = hasattr(estimator, "classes_")
    outputs = ["predict", "predict_proba", "decision_function"] if classifier else ["predict"]
    for dtype in (np.float64, np.float32):
        X = rows.astype(dtype)
        # The server refuses infinities (the runtime's input check); the kernel takes them.
        finite_or_nan = np.where(np.isinf(X), np.nan, X)
        assert compiled.rows(finite_or_nan) is not None  # the kernel answers, not scikit-learn
        got = infer(model, finite_or_nan, outputs)
        for name in outputs:
            expected = getattr(estimator, name)(finite_or_nan)
            assert got[name].shape == expected.shape, name
            assert np.array_equal(got[name], expected), name
            if hist:
                ours = compiled.methods()[name](compiled.rows(X))
                assert np.array_equal(ours, getattr(estimator, name)(X)), name


def test_gradient_boosting_leaves_rows_with_nan_to_scikit_learn(tmp_path):
    estimator, X = fitted("gb-regression")
    model = load(save_pickle(tmp_path / "m", estimator))
    rows = X[:20].copy()
    rows[3, 2] = np.nan
    assert model.runtime.compiled.rows(rows) is None
    assert model.runtime.compiled.rows(X[:20]) is not None


def test_hist_gradient_boosting_sends_nan_the_way_each_node_says(tmp_path):
    estimator, _ = fitted("hgb-regression")
    model = load(save_pickle(tmp_path / "m", estimator))
    nodes = estimator._predictors[0][0].nodes
    # Both directions occur in the model, so both rules are exercised.
    inner = ~nodes["is_leaf"].astype(bool)
    assert set(nodes["missing_go_to_left"][inner].tolist()) == {0, 1}
    rows = np.full((4, N_FEATURES), np.nan)
    rows[1:, :] = [[0.0] * N_FEATURES, [np.inf] * N_FEATURES, [-np.inf] * N_FEATURES]
    rows = np.vstack([rows, np.where(np.eye(N_FEATURES) == 1, np.nan, 0.5)])
    compiled = model.runtime.compiled
    assert np.array_equal(compiled.predict(compiled.rows(rows)), estimator.predict(rows))
    assert np.array_equal(infer(model, rows[:2])["predict"], estimator.predict(rows[:2]))


def categorical_data(rng, n: int = 2000):
    X = rng.normal(size=(n, 4))
    X[:, 1] = rng.integers(0, 30, size=n)
    X[:, 3] = rng.integers(-2, 5, size=n) * 1.5  # negative and fractional category values
    X[rng.random(n) < 0.05, 1] = np.nan
    X[rng.random(n) < 0.05, 0] = np.nan
    y = np.isin(X[:, 1], [1, 2, 5, 7, 11, 13]).astype(int) + (X[:, 3] > 0) + (X[:, 0] > 0.3)
    return X, y


@pytest.mark.parametrize("task", ["binary", "multiclass", "regression"])
def test_categorical_features_match_scikit_learn_with_unseen_negative_and_nan(tmp_path, task):
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    X, y = categorical_data(np.random.default_rng(0))
    options = {"max_iter": 20, "categorical_features": [1, 3], "random_state": 0}
    if task == "regression":
        estimator = HistGradientBoostingRegressor(**options).fit(X, y + X[:, 2])
    else:
        estimator = HistGradientBoostingClassifier(**options).fit(
            X, y > 1 if task == "binary" else y
        )
    model = load(save_pickle(tmp_path / "m", estimator))
    compiled = model.runtime.compiled
    assert compiled is not None, model.runtime.predictor()
    assert compiled.forest.category_features()  # the trees do split on categories
    rows, _ = categorical_data(np.random.default_rng(1), 800)
    rng = np.random.default_rng(2)
    unseen = rng.random(len(rows))
    rows[unseen < 0.1, 1] = 30 + rng.integers(0, 5, size=int((unseen < 0.1).sum()))
    rows[(unseen >= 0.1) & (unseen < 0.2), 1] = -1.0
    rows[(unseen >= 0.2) & (unseen < 0.3), 1] = 2.5
    rows[(unseen >= 0.3) & (unseen < 0.35), 3] = 0.75
    rows[(unseen >= 0.35) & (unseen < 0.4), 3] = np.nan
    outputs = ["predict"] + (["predict_proba", "decision_function"] if task != "regression" else [])
    for dtype in (np.float64, np.float32):
        X_test = rows.astype(dtype)
        assert compiled.rows(X_test) is not None
        got = infer(model, X_test, outputs)
        for name in outputs:
            assert np.array_equal(got[name], getattr(estimator, name)(X_test)), name


def test_categories_that_are_strings_stay_with_scikit_learn(tmp_path):
    import pandas as pd
    from sklearn.ensemble import HistGradientBoostingClassifier

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "colour": pd.Categorical(rng.choice(["red", "green", "blue"], size=300)),
            "size": rng.normal(size=300),
        }
    )
    y = (frame["colour"] == "red").to_numpy() ^ (frame["size"] > 0).to_numpy()
    estimator = HistGradientBoostingClassifier(max_iter=5).fit(frame, y)
    model = load(save_pickle(tmp_path / "m", estimator))
    assert model.runtime.compiled is None
    reason = "scikit-learn, not the tree kernel: categories that are not numbers"
    assert model.runtime.predictor() == reason


def test_a_gradient_boosting_init_estimator_that_varies_by_row_stays_with_scikit_learn(
    tmp_path,
):
    from sklearn.ensemble import GradientBoostingRegressor
    from sklearn.linear_model import LinearRegression

    X, y = training_data(np.random.default_rng(1), missing=False)
    estimator = GradientBoostingRegressor(n_estimators=5, init=LinearRegression()).fit(X, y)
    model = load(save_pickle(tmp_path / "m", estimator))
    assert model.runtime.compiled is None
    assert "the init estimator LinearRegression" in model.runtime.predictor()
    np.testing.assert_array_equal(infer(model, X[:10])["predict"], estimator.predict(X[:10]))


def test_a_model_fitted_on_a_dataframe_is_compiled_and_answers_by_column_name(tmp_path):
    import pandas as pd

    estimator, X = fitted("hgb-binary")
    columns = [f"f{i}" for i in range(N_FEATURES)]
    estimator.fit(pd.DataFrame(X, columns=columns), estimator.predict(X))
    model = load(save_pickle(tmp_path / "m", estimator))
    assert model.runtime.compiled is not None, model.runtime.predictor()
    frame = pd.DataFrame(X[:50], columns=columns)
    got = infer(model, X[:50], ["predict_proba"])["predict_proba"]
    assert np.array_equal(got, estimator.predict_proba(frame))


def test_a_category_the_model_never_binned_goes_the_missing_way():
    # scikit-learn bins a sample of at most 200,000 rows: a rare category can be missing
    # from the bin mapper's known categories, and then goes as missing values go. Here the
    # bin mapper forgets categories 3 and 5 of the first categorical feature, for
    # scikit-learn and the kernel alike.
    from sklearn.ensemble import HistGradientBoostingClassifier

    X, y = categorical_data(np.random.default_rng(0))
    estimator = HistGradientBoostingClassifier(
        max_iter=15, categorical_features=[1, 3], random_state=0
    ).fit(X, y > 1)
    mapper = estimator._bin_mapper
    known, index = mapper.make_known_categories_bitsets()
    forgetful = known.copy()
    forgetful[0, 0] &= ~np.uint32((1 << 3) | (1 << 5))
    mapper.make_known_categories_bitsets = lambda: (forgetful, index)
    compiled = CompiledBoosting(estimator)
    rows, _ = categorical_data(np.random.default_rng(3), 600)
    rows[::2, 1] = np.where(np.arange(300) % 2, 3.0, 5.0)
    got = compiled.predict_proba(compiled.rows(rows))
    assert np.array_equal(got, estimator.predict_proba(rows))
    mapper.make_known_categories_bitsets = lambda: (known, index)
    assert not np.array_equal(got, estimator.predict_proba(rows))  # the rule mattered
