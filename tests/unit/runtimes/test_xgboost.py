"""The XGBoost runtime against XGBoost's own predictions, for every artefact format."""

import warnings

import numpy as np
import pytest

from inferpool.errors import BadRequest
from inferpool.runtimes.xgboost import XGBoostRuntime
from tests.support.runtimes import (
    N_FEATURES,
    infer,
    load,
    save_booster,
    save_pickle,
    xgboost_estimator,
)

ALL_OUTPUTS = ["predict", "predict_proba", "margin", "contrib"]
ARTEFACTS = ["model.json", "model.ubj", "model.bst", "model.xgb", "model.joblib"]


def save(folder, estimator, artefact):
    if artefact == "model.joblib":
        return save_pickle(folder, estimator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # XGBoost warns about extensions it does not know
        return save_booster(folder, estimator.get_booster(), artefact)


def contributions(estimator, rows):
    import xgboost

    return estimator.get_booster().predict(xgboost.DMatrix(rows), pred_contribs=True)


@pytest.mark.parametrize("artefact", ARTEFACTS)
@pytest.mark.parametrize("n_classes", [2, 3])
def test_classifier_outputs_match_xgboost(tmp_path, artefact, n_classes):
    estimator, X = xgboost_estimator("classifier", n_classes=n_classes)
    model = load(save(tmp_path / "m", estimator, artefact))
    assert isinstance(model.runtime, XGBoostRuntime)
    rows = X[:20]
    out = infer(model, rows, ALL_OUTPUTS)
    assert np.array_equal(out["predict"], estimator.predict(rows))
    assert np.allclose(out["predict_proba"], estimator.predict_proba(rows))
    assert np.allclose(out["margin"], estimator.predict(rows, output_margin=True))
    assert np.allclose(out["contrib"], contributions(estimator, rows), atol=1e-5)


@pytest.mark.parametrize("artefact", ["model.json", "model.joblib"])
def test_regressor_outputs_match_xgboost(tmp_path, artefact):
    estimator, X = xgboost_estimator("regressor")
    model = load(save(tmp_path / "m", estimator, artefact))
    rows = X[:20]
    out = infer(model, rows, ["predict", "margin", "contrib"])
    assert np.allclose(out["predict"], estimator.predict(rows))
    assert np.allclose(out["margin"], estimator.predict(rows, output_margin=True))
    assert np.allclose(out["contrib"], contributions(estimator, rows), atol=1e-3)
    assert "predict_proba" not in model.output_names


def test_softmax_objective_predicts_labels_without_probabilities(tmp_path):
    estimator, X = xgboost_estimator("classifier", objective="multi:softmax")
    model = load(save(tmp_path / "m", estimator, "model.json"))
    assert "predict_proba" not in model.output_names
    expected = estimator.get_booster().inplace_predict(X[:20]).astype(int)
    assert np.array_equal(infer(model, X[:20])["predict"], expected)


def test_early_stopped_estimator_predicts_with_its_best_iteration(tmp_path):
    import xgboost

    from tests.support.runtimes import classification_data

    X, y = classification_data(2)
    estimator = xgboost.XGBClassifier(n_estimators=200, early_stopping_rounds=2, n_jobs=1)
    estimator.fit(X[:200], y[:200], eval_set=[(X[200:], y[200:])], verbose=False)
    assert estimator.best_iteration < 199
    model = load(save_pickle(tmp_path / "m", estimator))
    out = infer(model, X[:20], ["predict_proba"])
    assert np.allclose(out["predict_proba"], estimator.predict_proba(X[:20]))


def test_metadata_of_a_multiclass_booster(tmp_path):
    estimator, _ = xgboost_estimator("classifier", n_classes=3)
    model = load(save(tmp_path / "m", estimator, "model.ubj"))
    (spec,) = model.metadata["inputs"]
    assert spec["shape"] == [-1, N_FEATURES]
    assert spec["parameters"]["feature_names"] == [f"f{i}" for i in range(N_FEATURES)]
    outputs = {o["name"]: o for o in model.metadata["outputs"]}
    assert outputs["predict_proba"]["shape"] == [-1, 3]
    assert outputs["margin"]["shape"] == [-1, 3]
    assert outputs["contrib"]["shape"] == [-1, 3, N_FEATURES + 1]


def test_limit_threads_sets_nthread(tmp_path):
    import json

    estimator, X = xgboost_estimator("classifier")
    model = load(save(tmp_path / "m", estimator, "model.json"))
    model.runtime.limit_threads(1)
    config = json.loads(model.runtime.booster.save_config())
    assert config["learner"]["generic_param"]["nthread"] == "1"
    assert np.array_equal(infer(model, X[:20])["predict"], estimator.predict(X[:20]))


def test_wrong_feature_count_is_a_bad_request(tmp_path):
    estimator, X = xgboost_estimator("classifier")
    model = load(save(tmp_path / "m", estimator, "model.json"))
    with pytest.raises(BadRequest, match=f"expects {N_FEATURES} features, got {N_FEATURES + 1}"):
        infer(model, np.hstack([X[:2], X[:2, :1]]))


def test_mlserver_model_settings_with_a_bst_uri(tmp_path):
    import json

    estimator, X = xgboost_estimator("classifier")
    folder = save(tmp_path / "m", estimator, "model.bst")
    (folder / "model.bst").rename(folder / "trees.bst")
    settings = {
        "name": "m",
        "implementation": "mlserver_xgboost.XGBoostModel",
        "parameters": {"uri": "./trees.bst"},
    }
    (folder / "model-settings.json").write_text(json.dumps(settings))
    model = load(folder)
    assert isinstance(model.runtime, XGBoostRuntime)
    # MLServer reads a Booster's file as an XGBRegressor: predict is the Booster's output.
    expected = estimator.get_booster().inplace_predict(X[:10])
    np.testing.assert_allclose(infer(model, X[:10])["predict"], expected, rtol=1e-6)
