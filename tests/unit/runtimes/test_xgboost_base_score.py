"""The tree kernel reads XGBoost's estimated ``base_score`` as XGBoost does (issue 38):
since XGBoost 2.0 a default model estimates it from its labels (``boost_from_average``),
so any value occurs, and the margin XGBoost starts from is its C library's ``logf`` of it
(binary:logistic and reg:logistic: of ``1/p - 1``; count:poisson, reg:gamma, reg:tweedie:
of the value). Default models on skewed data take the kernel and answer as XGBoost."""

from __future__ import annotations

import numpy as np
import pytest

xgboost = pytest.importorskip("xgboost")

from benchmarks.kernel_grid import features, target  # noqa: E402
from inferpool.runtimes.trees.from_xgboost import CompiledXGBoost  # noqa: E402
from inferpool.runtimes.trees.verify import FLOAT32_RTOL  # noqa: E402
from tests.support.runtimes import infer, load, save_booster, save_pickle  # noqa: E402

# Values of base_score at which numpy's float32 log (or a float64 log rounded to float32)
# is one ulp off the C library's logf: each made the kernel fall back before.
LOGISTIC_SCORES = [0.075, 0.74, 0.0515, 0.26, 0.47, 0.93]
POSITIVE_SCORES = [13.775387, 0.3, 2.5, 7.1, 41.0, 170.0]


@pytest.mark.parametrize(
    ("objective", "scores"),
    [
        ("binary:logistic", LOGISTIC_SCORES),
        ("reg:logistic", LOGISTIC_SCORES),
        ("count:poisson", POSITIVE_SCORES),
        ("reg:gamma", POSITIVE_SCORES),
        ("reg:tweedie", POSITIVE_SCORES),
    ],
)
def test_the_base_margin_is_the_one_xgboost_starts_from(objective, scores):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 3)).astype(np.float32)
    for score in scores:
        labels = rng.random(64) < 0.5 if "logistic" in objective else rng.random(64) + 0.1
        params = {"objective": objective, "base_score": score, "max_depth": 2, "nthread": 1}
        booster = xgboost.train(params, xgboost.DMatrix(X, labels.astype(float)), 2)
        compiled = CompiledXGBoost(booster, {})
        # Equal to the bit: both add the same float32 leaves to the same start.
        margin = booster.inplace_predict(X, predict_type="margin")
        assert np.array_equal(compiled.margin(X), margin), (objective, score)
        np.testing.assert_allclose(
            compiled.values(X), booster.inplace_predict(X), rtol=FLOAT32_RTOL
        )


@pytest.mark.parametrize("filename", ["model.json", "model.joblib"])
@pytest.mark.parametrize(
    ("estimator", "feature_kind", "output"),
    [("XGBClassifier", "int", "predict_proba"), ("XGBRegressor_gamma", "float", "predict")],
)
def test_default_models_on_skewed_data_take_the_kernel(
    tmp_path, filename, estimator, feature_kind, output
):
    """Two cases of the grid (benchmarks/kernel_grid.py) that missed the kernel before:
    95/5 labels on integer features, a heavy-tailed target on float features."""
    rng = np.random.default_rng(0)
    X = features(feature_kind, rng)
    y = target("binary" if estimator == "XGBClassifier" else "positive", "skewed", X, rng)
    if estimator == "XGBClassifier":
        model = xgboost.XGBClassifier(n_jobs=1).fit(X, y)
        expected = model.predict_proba(X[:200])[:, 1]
    else:
        model = xgboost.XGBRegressor(n_jobs=1, objective="reg:gamma").fit(X, y)
        expected = model.predict(X[:200])
    folder = tmp_path / "model"
    if filename == "model.json":
        save_booster(folder, model.get_booster(), filename)
    else:
        save_pickle(folder, model, filename)
    loaded = load(folder)
    assert loaded.runtime.predictor().startswith("the tree kernel"), loaded.runtime.predictor()
    answer = infer(loaded, X[:200], [output])[output]
    got = answer[:, 1] if answer.ndim == 2 else answer
    np.testing.assert_allclose(got, expected, rtol=FLOAT32_RTOL)
