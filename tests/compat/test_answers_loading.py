"""Which artefact MLServer's implementation strings load, ``extra.predict_fn``, and the
cases of "same answers" that need no server (issue 13): each model is loaded and run
in this process through the engine's inference path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.errors import ModelLoadError
from tests.support.runtimes import (
    classification_data,
    infer,
    lightgbm_estimator,
    load,
    regression_data,
    save_pickle,
    xgboost_estimator,
)

LIGHTGBM = "mlserver_lightgbm.LightGBMModel"
XGBOOST = "mlserver_xgboost.XGBoostModel"
SKLEARN = "mlserver_sklearn.SKLearnModel"


def settings(folder: Path, implementation: str | None = None, **parameters: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    raw: dict[str, Any] = {"name": folder.name, "parameters": parameters}
    if implementation:
        raw["implementation"] = implementation
    (folder / "model-settings.json").write_text(json.dumps(raw))
    return folder


def test_lightgbm_booster_answers_probabilities_only_with_the_mlserver_string(
    tmp_path: Path,
) -> None:
    model, X = lightgbm_estimator("classifier", n_classes=2)
    booster = model.booster_
    mlserver = settings(tmp_path / "mlserver", LIGHTGBM)
    own = settings(tmp_path / "own")
    for folder in (mlserver, own):
        booster.save_model(str(folder / "model.bst"))
    answer = infer(load(mlserver), X[:5])
    assert list(answer) == ["predict"]
    np.testing.assert_allclose(answer["predict"], booster.predict(X[:5]).reshape(-1, 1))
    # Without the string, inferpool's own answer stays: class labels.
    labels = infer(load(own), X[:5])["predict"]
    np.testing.assert_array_equal(labels, model.predict(X[:5]))


def test_lightgbm_string_finds_model_bst_only(tmp_path: Path) -> None:
    model, _ = lightgbm_estimator("classifier")
    folder = settings(tmp_path / "txt", LIGHTGBM)
    model.booster_.save_model(str(folder / "model.txt"))
    with pytest.raises(ModelLoadError, match=r"model\.bst .*parameters\.uri"):
        load(folder)


@pytest.mark.parametrize(
    ("implementation", "library"), [(LIGHTGBM, "LightGBM"), (XGBOOST, "XGBoost")]
)
def test_booster_strings_refuse_a_pickle(tmp_path: Path, implementation: str, library: str) -> None:
    model, _ = (lightgbm_estimator if library == "LightGBM" else xgboost_estimator)("classifier")
    folder = settings(tmp_path / "pickled", implementation, uri="model.joblib")
    save_pickle(folder, model)
    with pytest.raises(ModelLoadError, match=r"not the pickle model\.joblib.*SKLearnModel"):
        load(folder)


def test_sklearn_string_loads_model_pickle_before_model_pkl(tmp_path: Path) -> None:
    from sklearn.linear_model import LinearRegression

    X, y = regression_data(rows=40)
    first = LinearRegression().fit(X, y)
    second = LinearRegression().fit(X, -y)
    folders = settings(tmp_path / "mlserver", SKLEARN), settings(tmp_path / "own")
    for folder in folders:
        save_pickle(folder, first, "model.pickle")
        save_pickle(folder, second, "model.pkl")
    mlserver, own = (load(folder) for folder in folders)
    expected = first.predict(X[:3]).reshape(-1, 1)
    np.testing.assert_allclose(infer(mlserver, X[:3])["predict"], expected)
    np.testing.assert_allclose(infer(own, X[:3])["predict"], second.predict(X[:3]))


def test_sklearn_string_serves_a_pickled_lightgbm_classifier_as_an_estimator(
    tmp_path: Path,
) -> None:
    model, X = lightgbm_estimator("classifier")
    folder = save_pickle(settings(tmp_path / "lgbm", SKLEARN), model)
    loaded = load(folder)
    assert loaded.output_names == ["predict", "predict_proba"]
    answer = infer(loaded, X[:4], ["predict", "predict_proba"])
    np.testing.assert_array_equal(answer["predict"], model.predict(X[:4]).reshape(-1, 1))
    np.testing.assert_allclose(answer["predict_proba"], model.predict_proba(X[:4]))


def test_sklearn_string_sends_a_transform_dataframe_one_output_per_column(
    tmp_path: Path,
) -> None:
    from sklearn.preprocessing import StandardScaler

    X, _ = classification_data(rows=40)
    scaler = StandardScaler().set_output(transform="pandas").fit(X)
    folder = save_pickle(settings(tmp_path / "scaler", SKLEARN), scaler)
    answer = infer(load(folder), X[:3], ["transform"])
    expected = scaler.transform(X[:3])
    assert list(answer) == [str(c) for c in expected.columns]
    for name in expected.columns:
        np.testing.assert_allclose(answer[str(name)], expected[[name]].to_numpy())


@pytest.mark.parametrize("implementation", [SKLEARN, None])
def test_predict_fn_chooses_the_default_output(tmp_path: Path, implementation: str | None) -> None:
    from sklearn.linear_model import LogisticRegression

    X, y = classification_data(rows=60)
    clf = LogisticRegression(max_iter=500).fit(X, y)
    folder = settings(tmp_path / "fn", implementation, extra={"predict_fn": "predict_proba"})
    answer = infer(load(save_pickle(folder, clf)), X[:3])
    assert list(answer) == ["predict_proba"]
    np.testing.assert_allclose(answer["predict_proba"], clf.predict_proba(X[:3]))


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("predict_joint_log_proba", "'predict_joint_log_proba' is not supported"),
        ("predict_proba", "'predict_proba': LinearRegression has no predict_proba"),
    ],
)
@pytest.mark.parametrize("implementation", [SKLEARN, None])
def test_predict_fn_inferpool_cannot_serve_fails_the_model(
    tmp_path: Path, implementation: str | None, value: str, reason: str
) -> None:
    from sklearn.linear_model import LinearRegression

    X, y = regression_data(rows=40)
    folder = settings(tmp_path / "fn", implementation, extra={"predict_fn": value})
    save_pickle(folder, LinearRegression().fit(X, y))
    with pytest.raises(ModelLoadError, match=reason):
        load(folder)


def test_predict_fn_holds_for_a_pickled_lightgbm_classifier_too(tmp_path: Path) -> None:
    model, X = lightgbm_estimator("classifier")
    folder = settings(tmp_path / "lgbm", extra={"predict_fn": "predict_proba"})
    answer = infer(load(save_pickle(folder, model)), X[:3])
    assert list(answer) == ["predict_proba"]
    np.testing.assert_allclose(answer["predict_proba"], model.predict_proba(X[:3]))
