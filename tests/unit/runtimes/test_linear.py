"""scikit-learn's linear models predicted by the linear kernel: every estimator and pipeline
kind it takes answers as scikit-learn does (values, dtypes, shapes) on fresh rows of every
numeric dtype, one row too; what it does not take, a compiled model that disagrees and the
switch leave the model to scikit-learn, and the load log says why."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable

import numpy as np
import pytest

from inferpool.runtimes import linear, linear_steps
from inferpool.runtimes.linear import CompiledLinear, is_linear, library_fills_underflow
from inferpool.runtimes.trees import Unsupported
from tests.support.runtimes import infer, load, save_pickle

N_FEATURES = 5
METHODS = ("predict", "predict_proba", "decision_function")


def classification(n_classes: int, labels: list[str] | None = None, rows: int = 200):
    from sklearn.datasets import make_classification

    X, y = make_classification(
        rows, N_FEATURES, n_informative=3, n_redundant=0, n_classes=n_classes, random_state=0
    )
    X = X * [1.0, 10.0, 0.1, 100.0, 1.0] + [0.0, 50.0, -3.0, 0.0, 7.0]
    return X, (np.asarray(labels)[y] if labels else y)


def float32(data):
    X, y = data
    return X.astype(np.float32), (y.astype(np.float32) if y.dtype.kind == "f" else y)


def regression(targets: int = 1, rows: int = 200, scaled: bool = True):
    from sklearn.datasets import make_regression

    X, y = make_regression(rows, N_FEATURES, n_targets=targets, noise=0.5, random_state=0)
    return (X * [1.0, 10.0, 0.1, 100.0, 1.0] if scaled else X), y


def categories(rows: int = 200):
    rng = np.random.default_rng(0)
    X = np.column_stack(
        [rng.integers(0, 4, rows), rng.choice([-2.5, 0.5, 10.0], rows), rng.integers(5, 7, rows)]
    ).astype(np.float64)
    y = (X[:, 0] + X[:, 1] + rng.normal(size=rows) > 2).astype(int)
    return X, y


def _models() -> dict[str, Callable[[], tuple[object, np.ndarray]]]:
    from sklearn import linear_model as lm
    from sklearn import svm
    from sklearn.pipeline import Pipeline, make_pipeline
    from sklearn.preprocessing import MinMaxScaler, OneHotEncoder, StandardScaler

    def fitted(estimator, data):
        X, y = data
        return estimator.fit(X, y), X

    logistic = {"max_iter": 2000}
    return {
        "logistic-binary": lambda: fitted(lm.LogisticRegression(**logistic), classification(2)),
        "logistic-multiclass": lambda: fitted(lm.LogisticRegression(**logistic), classification(3)),
        # Fitted on float32 rows: float32 coefficients.
        "logistic-float32": lambda: fitted(
            lm.LogisticRegression(**logistic), float32(classification(3))
        ),
        "logistic-binary-float32": lambda: fitted(
            lm.LogisticRegression(**logistic), float32(classification(2))
        ),
        "linear-regression-float32": lambda: fitted(lm.LinearRegression(), float32(regression())),
        "logistic-string-labels": lambda: fitted(
            lm.LogisticRegression(**logistic), classification(3, ["cat", "dog", "emu"])
        ),
        "logistic-binary-strings-liblinear": lambda: fitted(
            lm.LogisticRegression(solver="liblinear"), classification(2, ["no", "yes"])
        ),
        "sgd-log-loss": lambda: fitted(
            lm.SGDClassifier(loss="log_loss", random_state=0), classification(3)
        ),
        "sgd-log-loss-binary": lambda: fitted(
            lm.SGDClassifier(loss="log_loss", random_state=0), classification(2)
        ),
        "sgd-modified-huber": lambda: fitted(
            lm.SGDClassifier(loss="modified_huber", random_state=0), classification(3)
        ),
        "sgd-modified-huber-binary": lambda: fitted(
            lm.SGDClassifier(loss="modified_huber", random_state=0), classification(2)
        ),
        "sgd-hinge": lambda: fitted(lm.SGDClassifier(random_state=0), classification(3)),
        "linear-svc": lambda: fitted(svm.LinearSVC(), classification(3)),
        "linear-svc-binary": lambda: fitted(svm.LinearSVC(), classification(2, ["a", "b"])),
        "ridge-classifier": lambda: fitted(lm.RidgeClassifier(), classification(3)),
        "ridge-classifier-binary": lambda: fitted(lm.RidgeClassifier(), classification(2)),
        "linear-regression": lambda: fitted(lm.LinearRegression(), regression()),
        "linear-regression-two-targets": lambda: fitted(lm.LinearRegression(), regression(2)),
        "linear-regression-no-intercept": lambda: fitted(
            lm.LinearRegression(fit_intercept=False), regression()
        ),
        "ridge": lambda: fitted(lm.Ridge(), regression()),
        "lasso": lambda: fitted(lm.Lasso(alpha=0.1), regression()),
        "elastic-net": lambda: fitted(lm.ElasticNet(alpha=0.1), regression()),
        "sgd-regressor": lambda: fitted(lm.SGDRegressor(random_state=0), regression(scaled=False)),
        "linear-svr": lambda: fitted(svm.LinearSVR(random_state=0), regression(scaled=False)),
        "standard-scaler-logistic": lambda: fitted(
            make_pipeline(StandardScaler(), lm.LogisticRegression(**logistic)),
            classification(3, ["x", "y", "z"]),
        ),
        "standard-scaler-no-mean-ridge": lambda: fitted(
            make_pipeline(StandardScaler(with_mean=False), lm.Ridge()), regression()
        ),
        "standard-scaler-no-std-svc": lambda: fitted(
            make_pipeline(StandardScaler(with_std=False), svm.LinearSVC()), classification(2)
        ),
        "min-max-clip-logistic": lambda: fitted(
            make_pipeline(MinMaxScaler(clip=True), lm.LogisticRegression(**logistic)),
            classification(3),
        ),
        "min-max-range-lasso": lambda: fitted(
            make_pipeline(MinMaxScaler(feature_range=(-1, 2)), lm.Lasso(alpha=0.1)), regression()
        ),
        "two-scalers-sgd": lambda: fitted(
            make_pipeline(StandardScaler(), MinMaxScaler(), lm.SGDClassifier(random_state=0)),
            classification(3),
        ),
        "nested-pipeline-passthrough": lambda: fitted(
            Pipeline(
                [
                    ("scale", make_pipeline(StandardScaler(), "passthrough")),
                    ("nothing", "passthrough"),
                    ("model", lm.RidgeClassifier()),
                ]
            ),
            classification(3),
        ),
        "one-hot-ignore-logistic": lambda: fitted(
            make_pipeline(OneHotEncoder(handle_unknown="ignore"), lm.LogisticRegression()),
            categories(),
        ),
        "one-hot-dense-svc": lambda: fitted(
            make_pipeline(OneHotEncoder(sparse_output=False), svm.LinearSVC()), categories()
        ),
        "one-hot-error-ridge": lambda: fitted(
            make_pipeline(OneHotEncoder(), lm.Ridge()), (categories()[0], regression()[1])
        ),
    }


MODELS = _models()


def fresh_rows(X: np.ndarray, seed: int = 1) -> np.ndarray:
    """Rows like the training rows, some far beyond them, some zeros; categories for an
    encoder's columns (each column with few distinct values keeps them)."""
    rng = np.random.default_rng(seed)
    rows = X.mean(axis=0) + X.std(axis=0) * rng.normal(scale=2.0, size=(60, X.shape[1]))
    rows[:5] *= 1e3
    rows[rng.random(rows.shape) < 0.05] = 0.0
    for j in range(X.shape[1]):
        values = np.unique(X[:, j])
        if len(values) <= 4:
            rows[:, j] = rng.choice(values, size=len(rows))
    return rows


def payloads(X: np.ndarray) -> dict[str, np.ndarray]:
    rows = fresh_rows(X)
    kinds = {
        "float64": rows,
        "float32": rows.astype(np.float32),
        "one-row": rows[:1],
        "fortran-order": np.asfortranarray(rows),
    }
    integers = np.rint(rows)
    categorical = any(np.unique(column).size <= 4 for column in X.T)
    # Not for categories such as 0.5: rounded, they are unknown (an error to an encoder).
    if not categorical or np.array_equal(integers, rows):
        kinds["int64"] = integers.astype(np.int64)
    return kinds


def assert_same(ours: np.ndarray, theirs: np.ndarray) -> None:
    """scikit-learn's dtype and shape; labels equal, values within the load-time check's
    tolerance (in practice they are equal to the bit)."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape)
    if theirs.dtype.kind == "f":
        np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
    else:
        assert np.array_equal(ours, theirs)


def methods_of(estimator) -> list[str]:
    return [name for name in METHODS if hasattr(estimator, name)]


@pytest.mark.parametrize("case", MODELS)
def test_the_kernel_answers_as_scikit_learn_does(tmp_path, case):
    estimator, X = MODELS[case]()
    model = load(save_pickle(tmp_path / "m", estimator))
    runtime = model.runtime
    assert isinstance(runtime.compiled, CompiledLinear), runtime.predictor()
    assert re.fullmatch(r"the linear kernel \(.+, \d+ features(, .+)?\)", runtime.predictor())
    # Float32 rows go to the kernel unless scikit-learn scales them otherwise (its versions
    # differ there); without a scaler, both compute in float64.
    assert runtime.compiled.float32 or runtime.compiled.scalers
    methods = methods_of(estimator)
    assert set(runtime.kernel_methods) == set(methods)
    for kind, rows in payloads(X).items():
        if kind != "float32" or runtime.compiled.float32:  # the kernel answers, not the library
            assert runtime.compiled.rows(rows) is not None, kind
        got = runtime.predict(rows, methods)
        for name in methods:
            with np.errstate(invalid="ignore"):  # older versions: 0/0 where sigmoids underflow
                theirs = getattr(estimator, name)(rows)
            try:
                assert_same(got[name], theirs)
            except AssertionError as exc:
                raise AssertionError(f"{name} on {kind} rows: {exc}") from None


def test_rows_whose_every_sigmoid_underflows_answer_as_the_installed_library(tmp_path):
    """Uniform probabilities in recent scikit-learn, NaN (0/0) in older ones: the kernel
    answers as the installed version does."""
    estimator, X = MODELS["sgd-log-loss"]()
    model = load(save_pickle(tmp_path / "m", estimator))
    assert isinstance(model.runtime.compiled, CompiledLinear)
    # A row where every class's score is -10,000 (the coefficients' pseudo-inverse).
    far = np.linalg.pinv(estimator.coef_) @ np.full(len(estimator.classes_), -1e4)
    rows = np.vstack([X[:2], far])
    assert (estimator.decision_function(rows[2:]) < -800).all()
    got = model.runtime.predict(rows, ["predict_proba"])["predict_proba"]
    with np.errstate(invalid="ignore"):
        theirs = estimator.predict_proba(rows)
    assert_same(got, theirs)
    assert np.isnan(got[2]).all() != library_fills_underflow()


def test_the_load_log_names_the_model_and_its_shape(tmp_path):
    estimator, _ = MODELS["logistic-multiclass"]()
    model = load(save_pickle(tmp_path / "m", estimator))
    expected = "the linear kernel (LogisticRegression, 5 features, 3 classes)"
    assert model.runtime.predictor() == expected
    estimator, _ = MODELS["standard-scaler-logistic"]()
    model = load(save_pickle(tmp_path / "p", estimator))
    assert model.runtime.predictor().startswith(
        "the linear kernel (StandardScaler + LogisticRegression, 5 features, 3 classes"
    )
    estimator, _ = MODELS["linear-regression-two-targets"]()
    model = load(save_pickle(tmp_path / "r", estimator))
    assert (
        model.runtime.predictor() == "the linear kernel (LinearRegression, 5 features, 2 targets)"
    )


def test_requests_through_the_engine_path_get_scikit_learns_answers(tmp_path):
    estimator, X = MODELS["logistic-string-labels"]()
    model = load(save_pickle(tmp_path / "m", estimator))
    rows = fresh_rows(X)
    out = infer(model, rows, ["predict", "predict_proba", "decision_function"])
    assert np.array_equal(out["predict"], estimator.predict(rows))
    np.testing.assert_allclose(out["predict_proba"], estimator.predict_proba(rows), rtol=1e-9)
    np.testing.assert_allclose(out["decision_function"], estimator.decision_function(rows))
    (single,) = infer(model, rows[:1])["predict"]  # the default output, one row
    assert single == estimator.predict(rows[:1])[0]


def test_a_model_fitted_on_a_dataframe_takes_its_columns_in_any_order(tmp_path):
    import pandas as pd
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = classification(3)
    columns = [f"f{j}" for j in range(N_FEATURES)]
    frame = pd.DataFrame(X, columns=columns)
    estimator = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(frame, y)
    model = load(save_pickle(tmp_path / "m", estimator))
    assert isinstance(model.runtime.compiled, CompiledLinear), model.runtime.predictor()
    rows = pd.DataFrame(fresh_rows(X), columns=columns)
    shuffled = rows[columns[::-1]].astype({"f0": np.float32, "f1": np.int64})
    got = model.runtime.predict(shuffled, ["predict", "predict_proba"])
    expected = rows.astype({"f0": np.float32, "f1": np.int64})
    assert_same(got["predict"], estimator.predict(expected))
    assert_same(got["predict_proba"], estimator.predict_proba(expected))
    out = infer(model, rows.to_numpy(), ["predict_proba"])  # one 2-D input: framed
    np.testing.assert_allclose(out["predict_proba"], estimator.predict_proba(rows), rtol=1e-9)


def test_rows_the_kernel_does_not_take_go_to_scikit_learn(tmp_path):
    import pandas as pd
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = regression()
    columns = [f"f{j}" for j in range(N_FEATURES)]
    estimator = make_pipeline(StandardScaler(), Ridge()).fit(pd.DataFrame(X, columns=columns), y)
    model = load(save_pickle(tmp_path / "m", estimator))
    compiled = model.runtime.compiled
    assert isinstance(compiled, CompiledLinear)
    with_nan = pd.DataFrame(X[:3], columns=columns)
    with_nan.iloc[1, 2] = np.nan
    assert compiled.rows(with_nan) is None
    with pytest.raises(ValueError, match="NaN"):  # scikit-learn's own message (a 400)
        model.runtime.predict(with_nan, ["predict"])
    assert compiled.rows(X[:3].astype(np.float16)) is None
    assert compiled.rows(X[:3].astype(str)) is None


def test_an_unknown_category_the_encoder_refuses_gets_scikit_learns_error(tmp_path):
    estimator, X = MODELS["one-hot-error-ridge"]()
    model = load(save_pickle(tmp_path / "m", estimator))
    rows = X[:4].copy()
    assert model.runtime.compiled.rows(rows) is not None
    rows[2, 0] = 17.0
    assert model.runtime.compiled.rows(rows) is None
    with pytest.raises(ValueError, match="unknown categories"):
        model.runtime.predict(rows, ["predict"])


def test_unknown_categories_an_encoder_ignores_encode_as_zeros(tmp_path):
    estimator, X = MODELS["one-hot-ignore-logistic"]()
    model = load(save_pickle(tmp_path / "m", estimator))
    rows = fresh_rows(X)
    rows[::3, 0] = 9.0
    rows[::4, 1] = 0.25
    got = model.runtime.predict(rows, ["predict_proba", "decision_function"])
    assert_same(got["predict_proba"], estimator.predict_proba(rows))
    assert_same(got["decision_function"], estimator.decision_function(rows))


def unsupported_models() -> dict[str, Callable[[], object]]:
    from sklearn import linear_model as lm
    from sklearn.decomposition import PCA
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    X, y = classification(3)
    Xc, yc = categories()
    words = np.array(["a", "b", "c"])[Xc[:, :1].astype(int) % 3]

    class Mine(lm.LogisticRegression):
        pass

    return {
        "PCA in the pipeline (step 1)": lambda: make_pipeline(PCA(2), lm.LogisticRegression()).fit(
            X, y
        ),
        "a OneHotEncoder beside other transformers": lambda: make_pipeline(
            StandardScaler(), OneHotEncoder(handle_unknown="ignore"), lm.Ridge()
        ).fit(Xc, yc),
        "OneHotEncoder with dropped categories": lambda: make_pipeline(
            OneHotEncoder(drop="first"), lm.LogisticRegression()
        ).fit(Xc, yc),
        "OneHotEncoder with infrequent categories": lambda: make_pipeline(
            OneHotEncoder(min_frequency=80, handle_unknown="ignore"),
            lm.LogisticRegression(),
        ).fit(Xc, yc),
        "OneHotEncoder with <U1 categories": lambda: make_pipeline(
            OneHotEncoder(), lm.LogisticRegression()
        ).fit(words, yc),
        "a multilabel RidgeClassifier": lambda: lm.RidgeClassifier().fit(
            X, np.column_stack([y == 0, y == 1]).astype(int)
        ),
        "not linear: KNeighborsClassifier": lambda: _knn(X, y),
        "not linear: a subclass": lambda: Mine(max_iter=2000).fit(X, y),
    }


def _knn(X, y):
    from sklearn.neighbors import KNeighborsClassifier

    return KNeighborsClassifier().fit(X, y)


UNSUPPORTED = unsupported_models()


@pytest.mark.parametrize("reason", UNSUPPORTED)
def test_what_the_kernel_does_not_reproduce_raises_unsupported(reason):
    estimator = UNSUPPORTED[reason]()
    if reason.startswith("not linear"):
        assert not is_linear(estimator)
    with pytest.raises(Unsupported) as raised:
        CompiledLinear(estimator)
    if not reason.startswith("not linear"):
        assert str(raised.value) == reason


def test_a_pipeline_the_kernel_does_not_take_stays_with_scikit_learn(tmp_path):
    estimator = UNSUPPORTED["PCA in the pipeline (step 1)"]()
    model = load(save_pickle(tmp_path / "m", estimator))
    assert model.runtime.compiled is None
    assert model.runtime.predictor() == (
        "scikit-learn, not the linear kernel: PCA in the pipeline (step 1)"
    )
    X, _ = classification(3)
    rows = fresh_rows(X)
    got = model.runtime.predict(rows, ["predict_proba"])
    assert_same(got["predict_proba"], estimator.predict_proba(rows))


def test_a_model_that_is_not_linear_has_nothing_to_say_in_the_log(tmp_path):
    estimator = UNSUPPORTED["not linear: KNeighborsClassifier"]()
    model = load(save_pickle(tmp_path / "m", estimator))
    assert model.runtime.compiled is None
    assert model.runtime.predictor() == ""


def test_a_compiled_model_that_disagrees_with_scikit_learn_is_not_used(tmp_path, monkeypatch):
    estimator, X = MODELS["logistic-multiclass"]()
    # A wrong link function (no softmax): the probe rows must catch it.
    monkeypatch.setattr(linear, "_softmax", lambda scores: scores)
    model = load(save_pickle(tmp_path / "m", estimator))
    assert model.runtime.compiled is None
    assert model.runtime.predictor() == (
        "scikit-learn, not the linear kernel: predict_proba differs from the library's "
        "on probe rows"
    )
    rows = fresh_rows(X)
    got = model.runtime.predict(rows, ["predict", "predict_proba"])
    assert_same(got["predict_proba"], estimator.predict_proba(rows))
    assert_same(got["predict"], estimator.predict(rows))


def test_an_output_of_another_dtype_is_a_difference(tmp_path, monkeypatch):
    estimator, _ = MODELS["logistic-string-labels"]()
    original = CompiledLinear.predict
    monkeypatch.setattr(
        CompiledLinear, "predict", lambda self, scores: original(self, scores).astype(object)
    )
    model = load(save_pickle(tmp_path / "m", estimator))
    assert model.runtime.compiled is None
    assert model.runtime.predictor() == (
        "scikit-learn, not the linear kernel: predict: dtype object, scikit-learn's <U3"
    )


def test_float32_rows_that_differ_stay_with_scikit_learn_alone(tmp_path, monkeypatch):
    estimator, X = MODELS["standard-scaler-logistic"]()
    scale = linear_steps.Standardise.__call__

    def off_by_float32_ulps(self, matrix):
        matrix = scale(self, matrix)
        if matrix.dtype == np.float32:
            matrix *= np.float32(1 + 2**-20)
        return matrix

    monkeypatch.setattr(linear_steps.Standardise, "__call__", off_by_float32_ulps)
    model = load(save_pickle(tmp_path / "m", estimator))
    compiled = model.runtime.compiled
    assert isinstance(compiled, CompiledLinear)
    assert model.runtime.predictor().endswith("3 classes, float32 rows by scikit-learn)")
    rows = fresh_rows(X)
    assert compiled.rows(rows.astype(np.float32)) is None
    assert compiled.rows(rows) is not None
    got = model.runtime.predict(rows.astype(np.float32), ["predict_proba"])
    assert_same(got["predict_proba"], estimator.predict_proba(rows.astype(np.float32)))


def test_an_importer_crash_leaves_the_model_to_scikit_learn(tmp_path, monkeypatch, caplog):
    def broken(self, estimator):
        raise KeyError("coef_")

    monkeypatch.setattr(CompiledLinear, "_read_coefficients", broken)
    estimator, _ = MODELS["ridge"]()
    with caplog.at_level(logging.WARNING, logger="inferpool.runtimes.trees"):
        model = load(save_pickle(tmp_path / "m", estimator))
    assert model.runtime.compiled is None
    assert model.runtime.predictor() == (
        "scikit-learn; the linear kernel could not take it: KeyError: 'coef_'"
    )
    assert "linear kernel import failed" in caplog.text


def test_tree_kernel_false_keeps_linear_models_on_scikit_learn(tmp_path):
    estimator, X = MODELS["logistic-multiclass"]()
    folder = save_pickle(tmp_path / "m", estimator)
    settings = {"parameters": {"extra": {"tree_kernel": False}}}
    (folder / "model-settings.json").write_text(json.dumps(settings))
    model = load(folder)
    assert model.runtime.compiled is None
    assert model.runtime.predictor() == "scikit-learn (tree_kernel is off)"
    rows = fresh_rows(X)
    assert_same(model.runtime.predict(rows, ["predict"])["predict"], estimator.predict(rows))


def test_the_softmax_of_a_binary_multinomial_model_is_scikit_learns():
    # scikit-learn < 1.8 with multi_class="multinomial" and two classes: softmax([-d, d]).
    from sklearn.utils.extmath import softmax

    scores = np.random.default_rng(0).normal(scale=5.0, size=50)
    expected = softmax(np.c_[-scores, scores])
    assert np.array_equal(linear._softmax(scores), expected)
