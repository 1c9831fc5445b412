"""LightGBM and XGBoost models served over REST, in every artefact format, compared with
the libraries' own predictions; their metadata; and the 400s for requests that cannot fit."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from tests.support import Server
from tests.support.runtimes import (
    N_FEATURES,
    classification_data,
    lightgbm_estimator,
    output_array,
    rows_request,
    save_booster,
    save_pickle,
    xgboost_estimator,
)


def lightgbm_references(estimator) -> dict[str, Callable]:
    references = {
        "predict": estimator.predict,
        "raw_score": lambda X: estimator.predict(X, raw_score=True),
        "contrib": lambda X: estimator.predict(X, pred_contrib=True),
    }
    if hasattr(estimator, "predict_proba"):
        references["predict_proba"] = estimator.predict_proba
    return references


def xgboost_references(estimator) -> dict[str, Callable]:
    import xgboost

    booster = estimator.get_booster()
    references = {
        "predict": estimator.predict,
        "margin": lambda X: estimator.predict(X, output_margin=True),
        "contrib": lambda X: booster.predict(xgboost.DMatrix(X), pred_contribs=True),
    }
    if hasattr(estimator, "predict_proba"):
        references["predict_proba"] = estimator.predict_proba
    return references


def build_repository(root: Path) -> dict[str, tuple[str, dict[str, Callable], np.ndarray]]:
    """Model folders, and for each: its platform, reference outputs and test rows."""
    cases = {}
    lgb_multi, X = lightgbm_estimator("classifier", n_classes=3)
    lgb_binary, X2 = lightgbm_estimator("classifier", n_classes=2)
    lgb_regressor, Xr = lightgbm_estimator("regressor")
    save_booster(root / "lgb-txt", lgb_multi.booster_, "model.txt")
    save_booster(root / "lgb-bst", lgb_binary.booster_, "model.bst")
    save_pickle(root / "lgb-pickled", lgb_multi, "model.joblib")
    save_pickle(root / "lgb-regressor", lgb_regressor, "model.pkl")
    cases["lgb-txt"] = ("lightgbm", lightgbm_references(lgb_multi), X[:16])
    cases["lgb-bst"] = ("lightgbm", lightgbm_references(lgb_binary), X2[:16])
    cases["lgb-pickled"] = ("lightgbm", lightgbm_references(lgb_multi), X[:16])
    cases["lgb-regressor"] = ("lightgbm", lightgbm_references(lgb_regressor), Xr[:16])

    xgb_multi, X = xgboost_estimator("classifier", n_classes=3)
    xgb_binary, X2 = xgboost_estimator("classifier", n_classes=2)
    xgb_regressor, Xr = xgboost_estimator("regressor")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # XGBoost warns about extensions it does not know
        save_booster(root / "xgb-json", xgb_multi.get_booster(), "model.json")
        save_booster(root / "xgb-ubj", xgb_binary.get_booster(), "model.ubj")
        save_booster(root / "xgb-bst", xgb_multi.get_booster(), "model.bst")
        save_booster(root / "xgb-xgb", xgb_regressor.get_booster(), "model.xgb")
    save_pickle(root / "xgb-pickled", xgb_binary, "model.pickle")
    cases["xgb-json"] = ("xgboost", xgboost_references(xgb_multi), X[:16])
    cases["xgb-ubj"] = ("xgboost", xgboost_references(xgb_binary), X2[:16])
    cases["xgb-bst"] = ("xgboost", xgboost_references(xgb_multi), X[:16])
    cases["xgb-xgb"] = ("xgboost", xgboost_references(xgb_regressor), Xr[:16])
    cases["xgb-pickled"] = ("xgboost", xgboost_references(xgb_binary), X2[:16])

    # Fitted on a DataFrame: the features have names, which a `pd` request may use.
    X, y = classification_data(2)
    frame = pd.DataFrame(X, columns=[f"feature_{i}" for i in range(N_FEATURES)])
    import lightgbm

    named = lightgbm.LGBMClassifier(n_estimators=5, verbose=-1, n_jobs=1).fit(frame, y)
    save_booster(root / "lgb-named", named.booster_, "model.txt")
    # Its reference outputs take the rows under the feature names (else scikit-learn warns).
    references = {
        output: lambda X, reference=reference: reference(pd.DataFrame(X, columns=frame.columns))
        for output, reference in lightgbm_references(named).items()
    }
    cases["lgb-named"] = ("lightgbm", references, X[:16])
    return cases


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("trees")
    return root, build_repository(root)


@pytest.fixture(scope="module")
def cases(repository) -> dict:
    return repository[1]


@pytest.fixture(scope="module")
def server(repository) -> Iterator[Server]:
    with Server(repository[0], "--workers", "0") as server:
        server.wait_ready()
        yield server


MODELS = [
    "lgb-txt",
    "lgb-bst",
    "lgb-pickled",
    "lgb-regressor",
    "lgb-named",
    "xgb-json",
    "xgb-ubj",
    "xgb-bst",
    "xgb-xgb",
    "xgb-pickled",
]


def infer(server: Server, model: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)


@pytest.mark.parametrize("model", MODELS)
def test_every_output_matches_the_library(server, cases, model):
    _, references, rows = cases[model]
    response = infer(server, model, rows_request(rows, list(references)))
    assert response.status_code == 200, response.text
    for name, reference in references.items():
        expected = np.asarray(reference(rows))
        got = output_array(response.json(), name)
        assert got.shape == expected.shape, name
        if name == "predict" and "predict_proba" in references:
            assert np.array_equal(got, expected), name
        else:
            assert np.allclose(got, expected, rtol=1e-5, atol=1e-4), name


@pytest.mark.parametrize("model", MODELS)
def test_metadata_describes_the_model(server, cases, model):
    platform, references, _ = cases[model]
    metadata = httpx.get(f"{server.url}/v2/models/{model}").json()
    assert metadata["platform"] == platform
    (spec,) = metadata["inputs"]
    assert spec["shape"] == [-1, N_FEATURES]
    assert len(spec["parameters"]["feature_names"]) == N_FEATURES
    assert {o["name"] for o in metadata["outputs"]} == set(references)
    assert all(o["shape"][0] == -1 for o in metadata["outputs"])


def test_default_output_is_predict(server, cases):
    _, references, rows = cases["xgb-json"]
    response = infer(server, "xgb-json", rows_request(rows))
    assert [o["name"] for o in response.json()["outputs"]] == ["predict"]
    assert np.array_equal(output_array(response.json(), "predict"), references["predict"](rows))


@pytest.mark.parametrize("model", ["lgb-txt", "xgb-json"])
def test_wrong_feature_count_is_400_saying_what_was_expected(server, cases, model):
    _, _, rows = cases[model]
    response = infer(server, model, rows_request(rows[:, :5]))
    assert response.status_code == 400
    assert response.json()["error"] == (
        f"model '{model}' rejected input 'input-0': expects {N_FEATURES} features, got 5"
    )


def test_unknown_output_is_400_listing_the_outputs(server, cases):
    _, _, rows = cases["lgb-txt"]
    response = infer(server, "lgb-txt", rows_request(rows, ["shap"]))
    assert response.status_code == 400
    assert "'shap'" in response.json()["error"]
    assert "raw_score" in response.json()["error"]


def named_columns_request(rows: np.ndarray, names: list[str]) -> dict:
    """A `pd` request with one input per named column (in the order given)."""
    inputs = [
        {"name": name, "shape": [len(rows)], "datatype": "FP64", "data": rows[:, i].tolist()}
        for i, name in enumerate(names)
    ]
    return {"parameters": {"content_type": "pd"}, "inputs": inputs}


def test_pd_request_with_named_features_in_any_order(server, cases):
    _, references, rows = cases["lgb-named"]
    names = [f"feature_{i}" for i in range(N_FEATURES)]
    order = list(reversed(range(N_FEATURES)))
    body = named_columns_request(rows[:, order], [names[i] for i in order])
    response = infer(server, "lgb-named", body)
    assert response.status_code == 200, response.text
    assert np.array_equal(output_array(response.json(), "predict"), references["predict"](rows))


def test_pd_request_with_an_unknown_feature_is_400(server, cases):
    _, _, rows = cases["lgb-named"]
    names = [f"feature_{i}" for i in range(N_FEATURES - 1)] + ["colour"]
    response = infer(server, "lgb-named", named_columns_request(rows, names))
    assert response.status_code == 400
    assert "has no input 'colour'; expected: feature_0" in response.json()["error"]
