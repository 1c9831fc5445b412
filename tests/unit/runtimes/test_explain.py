"""Explanations in-process, model family by model family: the contributions plus the bias
add up to the model's raw score (margin, log-odds, decision function, probability or
value, as ``parameters.score`` says) on every row; Saabas contributions of small trees are
the ones worked out by hand; linear contributions are measured from the training mean;
a model that cannot explain, and bad input, answer a 400 that says why."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from inferpool.engine.worker.explain import explain
from inferpool.engine.worker.model import LoadedModel
from inferpool.errors import BadRequest
from inferpool.protocol.datatypes import datatype_of
from inferpool.protocol.types import InferenceRequest, RequestedOutput, Tensor
from tests.support.runtimes import (
    N_FEATURES,
    classification_data,
    lightgbm_estimator,
    load,
    regression_data,
    save_pickle,
    xgboost_estimator,
)

RTOL, ATOL = 1e-9, 1e-12
# XGBoost computes its contributions in float32.
XGBOOST_RTOL, XGBOOST_ATOL = 1e-5, 1e-5


def explained(model: LoadedModel, X: np.ndarray) -> tuple[np.ndarray, dict]:
    """The contributions of rows X (one input) and the output's parameters."""
    X = np.asarray(X)
    request = InferenceRequest([Tensor("input-0", datatype_of(X), X.shape, X)])
    response = explain(model, request)
    [output] = response.outputs
    assert output.name == "contributions" and output.datatype == "FP64"
    return np.asarray(output.data).reshape(output.shape), output.parameters


def loaded(tmp_path: Path, estimator, **settings) -> LoadedModel:
    folder = save_pickle(tmp_path / "model", estimator)
    if settings:
        (folder / "model-settings.json").write_text(json.dumps(settings))
    return load(folder)


def assert_sums(values: np.ndarray, raw: np.ndarray, rtol=RTOL, atol=ATOL) -> None:
    raw = np.asarray(raw, dtype=np.float64)
    sums = values.sum(axis=-1)
    assert sums.shape == raw.shape, (sums.shape, raw.shape)
    np.testing.assert_allclose(sums, raw, rtol=rtol, atol=atol)


# -- Saabas, by hand ------------------------------------------------------------------------


def test_a_regression_tree_credits_each_split_with_its_change_of_value(tmp_path):
    from sklearn.tree import DecisionTreeRegressor

    # Root mean 6; x0 <= 0.5: 0 (a leaf); else 12, split on x1: 10 or 14.
    X = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    y = np.array([0.0, 0.0, 10.0, 14.0])
    tree = DecisionTreeRegressor(max_depth=2, random_state=0).fit(X, y)
    assert tree.tree_.feature[0] == 0
    values, parameters = explained(loaded(tmp_path, tree), X)
    expected = np.array(
        [
            [-6.0, 0.0, 6.0],  # left leaf: 0 = 6 - 6
            [-6.0, 0.0, 6.0],
            [6.0, -2.0, 6.0],  # 10 = 6 + (12 - 6) + (10 - 12)
            [6.0, 2.0, 6.0],  # 14 = 6 + (12 - 6) + (14 - 12)
        ]
    )
    np.testing.assert_allclose(values, expected, rtol=0, atol=1e-12)
    assert parameters["score"] == "value"
    assert "class_labels" not in parameters


def test_a_binary_classification_tree_explains_the_positive_class_probability(tmp_path):
    from sklearn.tree import DecisionTreeClassifier

    # Root P(1) = 2/5; x <= 0.5: 0; else 2/3.
    X = np.array([[0.0], [0.0], [1.0], [1.0], [1.0]])
    y = np.array(["no", "no", "no", "yes", "yes"])
    values, parameters = explained(loaded(tmp_path, DecisionTreeClassifier().fit(X, y)), X[1:3])
    np.testing.assert_allclose(values, [[-0.4, 0.4], [2 / 3 - 0.4, 0.4]], rtol=0, atol=1e-12)
    assert parameters["class_labels"] == ["no", "yes"]
    assert parameters["positive_class"] == "yes"
    assert parameters["score"] == "probability"


def test_a_forest_averages_its_trees_contributions(tmp_path):
    from sklearn.ensemble import RandomForestRegressor

    # Two trees on the same rows (no bootstrap, every feature): the same tree twice, so
    # the forest's contributions are the single tree's.
    X = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    y = np.array([0.0, 0.0, 10.0, 14.0])
    forest = RandomForestRegressor(2, bootstrap=False, max_depth=2, random_state=0).fit(X, y)
    values, _ = explained(loaded(tmp_path, forest), X[2:])
    np.testing.assert_allclose(values, [[6.0, -2.0, 6.0], [6.0, 2.0, 6.0]], atol=1e-12)


# -- every family adds up to its raw score --------------------------------------------------


def sklearn_models():
    from sklearn.ensemble import (
        ExtraTreesClassifier,
        GradientBoostingClassifier,
        GradientBoostingRegressor,
        HistGradientBoostingClassifier,
        HistGradientBoostingRegressor,
        RandomForestClassifier,
        RandomForestRegressor,
    )
    from sklearn.tree import DecisionTreeClassifier

    multi, binary, regression = classification_data(3), classification_data(2), regression_data()
    counts = (regression[0], np.abs(regression[1]))

    def proba(m):
        return m.predict_proba

    def positive(m):
        return lambda X: m.predict_proba(X)[:, 1]

    def decision(m):
        return m.decision_function

    def predict(m):
        return m.predict

    def raw(m):  # HistGradientBoosting's sums before its link (one column: 1-D)
        one = m.n_trees_per_iteration_ == 1
        return lambda X: m._raw_predict(X)[:, 0] if one else m._raw_predict(X)

    return {
        "random-forest-multi": (RandomForestClassifier(20, random_state=0), multi, proba),
        "random-forest-regressor": (RandomForestRegressor(10, random_state=0), regression, predict),
        "extra-trees-binary": (ExtraTreesClassifier(10, random_state=0), binary, positive),
        "decision-tree-multi": (DecisionTreeClassifier(max_depth=5, random_state=0), multi, proba),
        "gradient-boosting-multi": (GradientBoostingClassifier(n_estimators=10), multi, decision),
        "gradient-boosting-binary": (GradientBoostingClassifier(n_estimators=10), binary, decision),
        "gradient-boosting-regressor": (GradientBoostingRegressor(), regression, predict),
        "hist-boosting-multi": (HistGradientBoostingClassifier(max_iter=10), multi, raw),
        "hist-boosting-binary": (HistGradientBoostingClassifier(max_iter=10), binary, raw),
        "hist-boosting-poisson": (HistGradientBoostingRegressor(loss="poisson"), counts, raw),
    }  # fmt: skip


@functools.cache
def fitted(name: str):
    """Each model fitted once for the module, on one thread (OpenMP's pool on a shared
    machine is slower than none)."""
    from threadpoolctl import threadpool_limits

    estimator, (X, y), score = sklearn_models()[name]
    with threadpool_limits(1):
        estimator.fit(X, y)
    return estimator, X, score


@pytest.mark.parametrize("tree_kernel", [True, False], ids=["kernel", "library"])
@pytest.mark.parametrize("name", list(sklearn_models()))
def test_sklearn_tree_contributions_add_up_to_the_raw_score(tmp_path, name, tree_kernel):
    estimator, X, score = fitted(name)
    settings = {"parameters": {"extra": {"tree_kernel": tree_kernel}}}
    model = loaded(tmp_path, estimator, **settings)
    values, _ = explained(model, X[:50])
    assert values.shape[-1] == N_FEATURES + 1
    assert_sums(values, score(estimator)(X[:50]))
    # Every feature is credited with something on some row: not all of it in the bias.
    assert np.abs(values[..., :-1]).sum() > 0


def test_hist_gradient_boosting_categories_are_credited_to_their_own_column(tmp_path):
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    X[:, 2] = rng.integers(0, 4, size=400)  # a category, the last column
    y = X[:, 0] + 5.0 * (X[:, 2] == 2)
    estimator = HistGradientBoostingRegressor(
        max_iter=20, categorical_features=[2], random_state=0
    ).fit(X, y)
    values, _ = explained(loaded(tmp_path, estimator), X[:100])
    assert_sums(values, estimator._raw_predict(X[:100])[:, 0])
    # The category decides most of y: its column, not column 0, holds that part.
    two = X[:100, 2] == 2
    assert values[two, 2].mean() > 2.0 > values[two, 0].mean()


def test_boosting_libraries_add_up_to_their_margin(tmp_path):
    lightgbm_margin = lambda m, X: m.predict(X, raw_score=True)  # noqa: E731
    xgboost_margin = lambda m, X: m.predict(X, output_margin=True)  # noqa: E731
    for make, rtol, atol, margin in (
        (lightgbm_estimator, RTOL, ATOL, lightgbm_margin),
        (xgboost_estimator, XGBOOST_RTOL, XGBOOST_ATOL, xgboost_margin),
    ):
        for kind, n_classes in (("classifier", 3), ("classifier", 2), ("regressor", 0)):
            estimator, X = make(kind, n_classes) if n_classes else make(kind)
            folder = tmp_path / f"{make.__name__}-{kind}-{n_classes}"
            model = load(save_pickle(folder, estimator))
            values, parameters = explained(model, X[:40])
            assert parameters["score"] == "raw_score"
            assert len(parameters["feature_names"]) == N_FEATURES
            expected_shape = (40, 3, N_FEATURES + 1) if n_classes == 3 else (40, N_FEATURES + 1)
            assert values.shape == expected_shape
            assert_sums(values, margin(estimator, X[:40]), rtol, atol)
            if n_classes:
                assert parameters["class_labels"] == list(range(n_classes))


def linear_models():
    from sklearn.linear_model import (
        ElasticNet,
        Lasso,
        LinearRegression,
        LogisticRegression,
        Ridge,
        RidgeClassifier,
        SGDClassifier,
        SGDRegressor,
    )
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler, StandardScaler
    from sklearn.svm import LinearSVC, LinearSVR

    multi, binary, regression = classification_data(3), classification_data(2), regression_data()
    two_targets = (regression[0], np.column_stack([regression[1], -2 * regression[1]]))
    return {
        "logistic-multi": (LogisticRegression(max_iter=1000), multi),
        "logistic-binary": (LogisticRegression(max_iter=1000), binary),
        "linear-svc": (LinearSVC(), multi),
        "linear-regression": (LinearRegression(), regression),
        "ridge-two-targets": (Ridge(), two_targets),
        "elastic-net": (ElasticNet(alpha=0.1), regression),
        "sgd-regressor": (SGDRegressor(random_state=0), regression),
        "sgd-classifier": (SGDClassifier(random_state=0), multi),
        "ridge-classifier-binary": (RidgeClassifier(), binary),
        "lasso": (Lasso(alpha=0.1), regression),
        "linear-svr": (LinearSVR(random_state=0), regression),
        "scaled-logistic": (make_pipeline(StandardScaler(), LogisticRegression()), multi),
        "clipped-min-max-ridge": (make_pipeline(MinMaxScaler(clip=True), Ridge()), regression),
    }  # fmt: skip


@pytest.mark.parametrize("name", list(linear_models()))
def test_linear_contributions_add_up_to_the_decision_function(tmp_path, name):
    estimator, (X, y) = linear_models()[name]
    estimator.fit(X, y)
    model = loaded(tmp_path, estimator)
    rows = X[:50] * 1.5  # some beyond the training range (clipped by a MinMaxScaler)
    values, parameters = explained(model, rows)
    classifier = hasattr(estimator, "classes_")
    score = estimator.decision_function if classifier else estimator.predict
    assert parameters["score"] == ("decision_function" if classifier else "value")
    assert_sums(values, score(rows), atol=1e-9)


def test_a_standard_scaled_model_is_explained_from_the_training_mean(tmp_path):
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = regression_data()
    X = X * 3.0 + 7.0
    pipeline = make_pipeline(StandardScaler(), Ridge()).fit(X, y)
    scaler, ridge = pipeline[0], pipeline[1]
    rows = np.vstack([scaler.mean_, X[:5]])
    values, _ = explained(loaded(tmp_path, pipeline), rows)
    # In the pipeline's input features: coefficient / scale * (x - mean).
    expected = ridge.coef_ / scaler.scale_ * (rows - scaler.mean_)
    np.testing.assert_allclose(values[:, :-1], expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(values[0, :-1], 0.0, atol=1e-12)  # the mean row: all bias
    at_mean = pipeline.predict(scaler.mean_[np.newaxis, :])[0]
    np.testing.assert_allclose(values[:, -1], at_mean, rtol=1e-12)


def test_one_hot_columns_are_summed_back_to_their_feature(tmp_path):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    rng = np.random.default_rng(0)
    X = rng.integers(0, 4, size=(300, 2)).astype(np.float64)
    y = (X[:, 0] == 1) | (X[:, 1] == 3)
    pipeline = make_pipeline(OneHotEncoder(), LogisticRegression()).fit(X, y)
    values, _ = explained(loaded(tmp_path, pipeline), X[:20])
    assert values.shape == (20, 3)  # two input features (not 8 one-hot columns) + bias
    assert_sums(values, pipeline.decision_function(X[:20]))
    coef = pipeline[-1].coef_[0]
    # Feature 1's category c is one-hot column 4 + c: its contribution is that coefficient.
    np.testing.assert_allclose(values[:, 1], coef[4 + X[:20, 1].astype(int)], rtol=1e-12)


def test_a_dataframe_model_names_its_features(tmp_path):
    import pandas as pd
    from sklearn.ensemble import RandomForestClassifier

    X, y = classification_data(3)
    names = [f"f{i}" for i in range(N_FEATURES)]
    forest = RandomForestClassifier(10, random_state=0).fit(pd.DataFrame(X, columns=names), y)
    model = loaded(tmp_path, forest)
    frame = pd.DataFrame(X[:10], columns=names)
    request = InferenceRequest(
        [Tensor(n, "FP64", (10, 1), frame[[n]].to_numpy()) for n in names],
        outputs=[RequestedOutput("contributions")],  # not the model's output: ignored
    )
    [output] = explain(model, request).outputs
    values = np.asarray(output.data).reshape(output.shape)
    assert output.parameters["feature_names"] == names
    assert output.parameters["class_labels"] == [0, 1, 2]
    assert values.shape == (10, 3, N_FEATURES + 1)
    assert_sums(values, forest.predict_proba(frame))


# -- what cannot be explained ---------------------------------------------------------------


def test_a_model_without_an_explainer_says_so(tmp_path):
    from sklearn.neighbors import KNeighborsClassifier

    X, y = classification_data(3)
    model = loaded(tmp_path, KNeighborsClassifier().fit(X, y))
    with pytest.raises(BadRequest) as caught:
        explained(model, X[:2])
    assert caught.value.message.startswith(
        "model 'model' cannot explain: KNeighborsClassifier has no explainer"
    )


def test_input_that_does_not_fit_is_refused_as_infer_refuses_it(tmp_path):
    from sklearn.ensemble import RandomForestRegressor

    X, y = regression_data()
    model = loaded(tmp_path, RandomForestRegressor(5, random_state=0).fit(X, y))
    with pytest.raises(BadRequest, match="expects 8 features, got 3"):
        explained(model, X[:2, :3])
    with pytest.raises(BadRequest, match="cannot take infinite values"):
        explained(model, np.full((1, N_FEATURES), np.inf))


# -- the explainer runtime ------------------------------------------------------------------


def test_an_explainer_model_answers_infer_with_its_models_explanation(tmp_path):
    from sklearn.ensemble import GradientBoostingRegressor

    from inferpool.engine.worker import inference

    X, y = regression_data()
    boosting = GradientBoostingRegressor(n_estimators=5, random_state=0).fit(X, y)
    target = loaded(tmp_path, boosting)
    explainer = tmp_path / "explainer"
    explainer.mkdir()
    settings = {"runtime": "explainer", "parameters": {"extra": {"explains": "../model"}}}
    (explainer / "model-settings.json").write_text(json.dumps(settings))
    model = load(explainer)
    assert model.metadata["inputs"] == target.metadata["inputs"]
    request = InferenceRequest([Tensor("input-0", "FP64", (5, N_FEATURES), X[:5])])
    [output] = inference.infer(model, request).outputs
    assert output.name == "contributions" and output.parameters["score"] == "raw_score"
    np.testing.assert_array_equal(output.data, explained(target, X[:5])[0])


@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        ({}, "an explainer names the model it explains: parameters.explains"),
        ({"explains": "../nowhere"}, "is not a folder"),
        ({"explains": "../explainer"}, "is an explainer too"),
    ],
)
def test_an_explainer_without_a_model_to_explain_fails_to_load(tmp_path, parameters, reason):
    from inferpool.errors import ModelLoadError

    explainer = tmp_path / "explainer"
    explainer.mkdir()
    settings = {"implementation": "explainer", "parameters": parameters}
    (explainer / "model-settings.json").write_text(json.dumps(settings))
    with pytest.raises(ModelLoadError, match=reason):
        load(explainer)


def test_the_kernel_walk_rejects_arrays_that_do_not_fit_the_forest():
    from sklearn.tree import DecisionTreeRegressor

    from inferpool.runtimes.trees import _kernel
    from inferpool.runtimes.trees.sklearn_contributions import tree_contributions

    X, y = regression_data()
    path = tree_contributions(DecisionTreeRegressor(max_depth=3).fit(X, y), None).path
    forest = path.forest
    args = (forest.nodes, path.values, forest.trees, 1, N_FEATURES)
    rows = np.zeros((2, N_FEATURES))
    with pytest.raises(ValueError, match="rows x columns x"):
        _kernel.contributions(*args, rows, np.zeros((2, 1, N_FEATURES)))
    with pytest.raises(ValueError, match="rows x columns x"):
        _kernel.contributions(*args, rows, np.zeros((2, 1, N_FEATURES + 1), np.float32))
    with pytest.raises(ValueError, match="a row per row"):
        _kernel.contributions(*args, rows, np.zeros((3, 1, N_FEATURES + 1)))
    with pytest.raises(ValueError, match="inconsistent"):
        _kernel.contributions(forest.nodes, path.values[:-1], *args[2:], rows, np.zeros((2, 1, 9)))
    with pytest.raises(ValueError, match="outside the forest"):
        _kernel.contributions(*args, rows, np.zeros((2, 0, N_FEATURES + 1)))
