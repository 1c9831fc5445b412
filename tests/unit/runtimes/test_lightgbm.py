"""The LightGBM runtime against LightGBM's own predictions, for every artefact format."""

import numpy as np
import pytest

from inferpool.errors import BadRequest
from inferpool.runtimes.lightgbm import LightGBMRuntime
from tests.support.runtimes import (
    N_FEATURES,
    infer,
    lightgbm_estimator,
    load,
    save_booster,
    save_pickle,
)

ALL_OUTPUTS = ["predict", "predict_proba", "raw_score", "contrib"]


def save(folder, estimator, artefact):
    if artefact == "model.joblib":
        return save_pickle(folder, estimator)
    return save_booster(folder, estimator.booster_, artefact)


@pytest.mark.parametrize("artefact", ["model.txt", "model.bst", "model.joblib"])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_classifier_outputs_match_lightgbm(tmp_path, artefact, n_classes):
    estimator, X = lightgbm_estimator("classifier", n_classes=n_classes)
    model = load(save(tmp_path / "m", estimator, artefact))
    assert isinstance(model.runtime, LightGBMRuntime)
    rows = X[:20]
    out = infer(model, rows, ALL_OUTPUTS)
    assert np.array_equal(out["predict"], estimator.predict(rows))
    assert np.allclose(out["predict_proba"], estimator.predict_proba(rows))
    assert np.allclose(out["raw_score"], estimator.predict(rows, raw_score=True))
    assert np.allclose(out["contrib"], estimator.predict(rows, pred_contrib=True))
    assert list(infer(model, rows)) == ["predict"]  # the default output


@pytest.mark.parametrize("artefact", ["model.txt", "model.joblib"])
def test_regressor_outputs_match_lightgbm(tmp_path, artefact):
    estimator, X = lightgbm_estimator("regressor")
    model = load(save(tmp_path / "m", estimator, artefact))
    rows = X[:20]
    out = infer(model, rows, ["predict", "raw_score", "contrib"])
    assert np.allclose(out["predict"], estimator.predict(rows))
    assert np.allclose(out["raw_score"], estimator.predict(rows, raw_score=True))
    assert np.allclose(out["contrib"], estimator.predict(rows, pred_contrib=True))
    assert "predict_proba" not in model.output_names


def test_metadata_of_a_multiclass_booster(tmp_path):
    estimator, _ = lightgbm_estimator("classifier", n_classes=3)
    model = load(save(tmp_path / "m", estimator, "model.txt"))
    (spec,) = model.metadata["inputs"]
    assert spec["shape"] == [-1, N_FEATURES]
    assert spec["parameters"]["feature_names"] == [f"Column_{i}" for i in range(N_FEATURES)]
    outputs = {o["name"]: o for o in model.metadata["outputs"]}
    assert outputs["predict"]["datatype"] == "INT64"
    assert outputs["predict_proba"]["shape"] == [-1, 3]
    assert outputs["raw_score"]["shape"] == [-1, 3]
    assert outputs["contrib"]["shape"] == [-1, 3 * (N_FEATURES + 1)]


def test_pickled_classifier_keeps_its_string_labels(tmp_path):
    import lightgbm

    from tests.support.runtimes import classification_data

    X, y = classification_data(2)
    labels = np.array(["no", "yes"])[y]
    estimator = lightgbm.LGBMClassifier(n_estimators=5, verbose=-1, n_jobs=1).fit(X, labels)
    model = load(save_pickle(tmp_path / "m", estimator))
    assert infer(model, X[:10])["predict"].tolist() == estimator.predict(X[:10]).tolist()
    assert model.metadata["outputs"][0]["datatype"] == "BYTES"


def test_limit_threads_caps_num_threads_and_keeps_predictions(tmp_path):
    estimator, X = lightgbm_estimator("classifier")
    model = load(save(tmp_path / "m", estimator, "model.txt"))
    before = infer(model, X[:20], ["predict_proba"])["predict_proba"]
    model.runtime.limit_threads(1)
    assert model.runtime.predict_params == {"num_threads": 1}
    assert np.array_equal(infer(model, X[:20], ["predict_proba"])["predict_proba"], before)


def test_wrong_feature_count_is_a_bad_request(tmp_path):
    estimator, X = lightgbm_estimator("classifier")
    model = load(save(tmp_path / "m", estimator, "model.txt"))
    with pytest.raises(BadRequest, match=f"expects {N_FEATURES} features, got 3"):
        infer(model, X[:2, :3])


def test_mlserver_model_settings_with_a_bst_uri(tmp_path):
    import json

    estimator, X = lightgbm_estimator("classifier")
    folder = save_booster(tmp_path / "m", estimator.booster_, "iris-lgb.bst")
    settings = {
        "name": "m",
        "implementation": "mlserver_lightgbm.LightGBMModel",
        "parameters": {"uri": "./iris-lgb.bst", "version": "v1"},
    }
    (folder / "model-settings.json").write_text(json.dumps(settings))
    model = load(folder)
    assert isinstance(model.runtime, LightGBMRuntime)
    assert model.metadata["versions"] == ["v1"]
    # MLServer's answer for its implementation string: Booster.predict (probabilities).
    expected = estimator.booster_.predict(X[:10])
    np.testing.assert_allclose(infer(model, X[:10])["predict"], expected)
