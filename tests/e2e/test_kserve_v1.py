"""KServe's V1 protocol against a real server with two workers, as KServe's sklearnserver,
xgbserver and lgbserver answer it: ``:predict`` equals the model's own ``predict`` on the
same rows (lists of numbers, objects by feature name, strings), ``:explain`` the model's
attributions, readiness and the model list, and the errors (400, 404, 503) as
``{"error"}``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from tests.support import Server, iris_data, write_sklearn_model
from tests.support.runtimes import (
    classification_data,
    lightgbm_estimator,
    regression_data,
    save_booster,
    save_pickle,
)

TEXTS = ["good movie", "great film", "bad movie", "awful film", "great plot", "bad plot"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The repository, and each model as its library holds it."""
    import lightgbm
    import xgboost
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    root = tmp_path_factory.mktemp("kserve-v1")
    X, y = iris_data()
    classifier = RandomForestClassifier(20, random_state=0, n_jobs=1).fit(X, y)
    write_sklearn_model(root / "sk-classifier", classifier)
    Xr, yr = regression_data()
    regressor = RandomForestRegressor(10, random_state=0, n_jobs=1).fit(Xr, yr)
    write_sklearn_model(root / "sk-regressor", regressor)
    frame = pd.DataFrame(X, columns=["sl", "sw", "pl", "pw"])
    framed = LogisticRegression(max_iter=1000).fit(frame, y)
    save_pickle(root / "sk-frame", framed)
    text = make_pipeline(TfidfVectorizer(), LogisticRegression()).fit(TEXTS, [1, 1, 0, 0, 1, 0])
    save_pickle(root / "sk-text", text)
    Xb, yb = classification_data(2)
    dmatrix = xgboost.DMatrix(Xb, label=yb)
    params = {"objective": "binary:logistic", "max_depth": 3, "nthread": 1}
    xgb = xgboost.train(params, dmatrix, num_boost_round=10)
    save_booster(root / "xgb", xgb, "model.json")
    Xm, ym = classification_data(3)
    names = [f"f{i}" for i in range(Xm.shape[1])]
    lgb = lightgbm.LGBMClassifier(n_estimators=10, num_leaves=7, n_jobs=1, verbose=-1)
    lgb.fit(pd.DataFrame(Xm, columns=names), ym)
    save_booster(root / "lgb", lgb.booster_, "model.txt")
    lgb_regressor, _ = lightgbm_estimator("regressor")
    save_booster(root / "lgb-regressor", lgb_regressor.booster_, "model.txt")
    return root, {
        "sk-classifier": classifier,
        "sk-regressor": regressor,
        "sk-frame": framed,
        "sk-text": text,
        "xgb": xgb,
        "lgb": lgb.booster_,
        "lgb-regressor": lgb_regressor.booster_,
    }


@pytest.fixture(scope="module")
def server(models: tuple[Path, dict]) -> Iterator[Server]:
    """The models, and ``broken`` FAILED (kept serving: --no-exit-on-error)."""
    broken = models[0] / "broken"
    broken.mkdir()
    (broken / "model.joblib").write_bytes(b"not a model")
    with Server(models[0], "--workers", "2", "--no-exit-on-error") as running:
        running.wait_live()
        expected = {**dict.fromkeys(models[1], "READY"), "broken": "FAILED"}
        deadline = time.monotonic() + 90
        while (states := model_states(running)) != expected and time.monotonic() < deadline:
            time.sleep(0.1)
        assert states == expected, running.output()
        yield running


def model_states(server: Server) -> dict[str, str]:
    index = httpx.post(f"{server.url}/v2/repository/index", timeout=10).json()
    return {entry["name"]: entry["state"] for entry in index}


def predict(server: Server, model: str, body: object) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}:predict", json=body, timeout=30)


def predictions(server: Server, model: str, instances: list) -> np.ndarray:
    reply = predict(server, model, {"instances": instances})
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/json"
    (key,) = reply.json()
    assert key == "predictions"
    return np.asarray(reply.json()["predictions"])


def test_sklearn_classifier_and_regressor(server: Server, models) -> None:
    _, library = models
    X = iris_data()[0][::13]
    assert predictions(server, "sk-classifier", X.tolist()).tolist() == (
        library["sk-classifier"].predict(X).tolist()
    )
    Xr = regression_data()[0][:7]
    expected = library["sk-regressor"].predict(Xr)
    np.testing.assert_allclose(predictions(server, "sk-regressor", Xr.tolist()), expected)


def test_inputs_is_a_synonym_of_instances(server: Server, models) -> None:
    X = iris_data()[0][::29]
    reply = predict(server, "sk-classifier", {"inputs": X.tolist()})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"predictions": models[1]["sk-classifier"].predict(X).tolist()}


def test_xgboost_booster(server: Server, models) -> None:
    import xgboost

    X = classification_data(2)[0][:9]
    expected = models[1]["xgb"].predict(xgboost.DMatrix(X))  # [n]: one probability a row
    got = predictions(server, "xgb", X.tolist())
    assert got.shape == (9,)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_lightgbm_boosters(server: Server, models) -> None:
    X = classification_data(3)[0][:6]
    expected = models[1]["lgb"].predict(X)  # [n, 3] class probabilities
    got = predictions(server, "lgb", X.tolist())
    assert got.shape == (6, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    Xr = regression_data()[0][:5]
    got = predictions(server, "lgb-regressor", Xr.tolist())
    np.testing.assert_allclose(got, models[1]["lgb-regressor"].predict(Xr), rtol=1e-6)


def test_objects_by_feature_name(server: Server, models) -> None:
    """LightGBM's feature names order the columns, whatever order the objects have; KServe's
    two forms (an object of columns, a list of records) and plain records agree."""
    X = classification_data(3)[0][:4]
    names = [f"f{i}" for i in range(X.shape[1])]
    records = [dict(reversed(list(zip(names, row, strict=True)))) for row in X.tolist()]
    expected = models[1]["lgb"].predict(X)
    for instances in (
        records,
        [records],
        [{name: X[:, i].tolist() for i, name in enumerate(names)}],
    ):
        np.testing.assert_allclose(predictions(server, "lgb", instances), expected, rtol=1e-6)


def test_objects_for_a_model_fitted_on_a_frame(server: Server, models) -> None:
    X = iris_data()[0][::17]
    frame = pd.DataFrame(X, columns=["sl", "sw", "pl", "pw"])
    expected = models[1]["sk-frame"].predict(frame).tolist()
    records = frame[["pw", "pl", "sw", "sl"]].to_dict(orient="records")
    assert predictions(server, "sk-frame", records).tolist() == expected
    assert predictions(server, "sk-frame", X.tolist()).tolist() == expected  # rows too


def test_strings(server: Server, models) -> None:
    texts = ["great movie", "awful plot", "good film"]
    expected = models[1]["sk-text"].predict(texts).tolist()
    assert predictions(server, "sk-text", texts).tolist() == expected


def test_explain(server: Server, models) -> None:
    """The forest's contributions, the same as the V2 ``explain`` endpoint's, adding up to
    each row's class probabilities."""
    X = iris_data()[0][::31]
    reply = httpx.post(
        f"{server.url}/v1/models/sk-classifier:explain", json={"instances": X.tolist()}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    explanation = reply.json()["explanations"]
    assert explanation["score"] == "probability"
    assert explanation["class_labels"] == [0, 1, 2]
    contributions = np.asarray(explanation["contributions"])
    assert contributions.shape == (len(X), 3, 5)
    expected = models[1]["sk-classifier"].predict_proba(X)
    np.testing.assert_allclose(contributions.sum(axis=-1), expected, atol=1e-9)
    v2 = httpx.post(
        f"{server.url}/v2/models/sk-classifier/explain",
        json={"inputs": [{"name": "input-0", "datatype": "FP64", "shape": list(X.shape),
                          "data": X.ravel().tolist()}]},
        timeout=30,
    )  # fmt: skip
    assert v2.status_code == 200, v2.text
    np.testing.assert_allclose(np.ravel(v2.json()["outputs"][0]["data"]), contributions.ravel())


def test_a_model_not_ready_is_503(server: Server) -> None:
    """KServe's sentence, with inferpool's reason; the SDK's ``is_model_ready`` reads a 503
    as not ready."""
    for reply in (
        httpx.get(f"{server.url}/v1/models/broken", timeout=10),
        predict(server, "broken", {"instances": [[1.0]]}),
    ):
        assert reply.status_code == 503
        error = reply.json()["error"]
        assert error.startswith("Model with name broken is not ready. "), error
        assert "model.joblib" in error


def test_readiness_and_list(server: Server, models) -> None:
    reply = httpx.get(f"{server.url}/v1/models/xgb", timeout=10)
    assert (reply.status_code, reply.json()) == (200, {"name": "xgb", "ready": True})
    reply = httpx.get(f"{server.url}/v1/models/nope", timeout=10)
    assert reply.status_code == 404
    assert reply.json() == {"error": "Model with name nope does not exist."}
    reply = httpx.get(f"{server.url}/v1/models", timeout=10)
    assert reply.status_code == 200
    assert reply.json() == {"models": sorted([*models[1], "broken"])}
    assert httpx.get(f"{server.url}/", timeout=10).json() == {"status": "alive"}


@pytest.mark.parametrize(
    ("model", "body", "words"),
    [
        ("sk-classifier", {"rows": [[1, 2, 3, 4]]}, 'Expected "instances" or "inputs"'),
        ("sk-classifier", {"instances": {"a": 1}}, 'Expected "instances" to be a list'),
        ("sk-classifier", {"instances": []}, '"instances" is empty'),
        ("sk-classifier", [[1, 2, 3, 4]], "JSON object"),
        ("sk-classifier", {"instances": [[1, 2, 3]]}, "expects 4 values per instance"),
        ("sk-classifier", {"instances": [[1, 2, 3, 4], [1, 2]]}, "the same length"),
        ("sk-classifier", {"instances": [[1, 2, "x", 4]]}, "numbers only"),
        ("sk-classifier", {"instances": ["a", 1]}, "mixing strings"),
        ("lgb", {"instances": [{"f0": 1.0}]}, "missing feature(s) f1, f2"),
        ("sk-frame", {"instances": [{"sl": 1, "sw": 2, "pl": 3}]}, "missing column(s) pw"),
        ("sk-frame", {"instances": [[1, 2, 3]]}, "each instance must hold 4 values, not 3"),
    ],
)
def test_bad_bodies_are_400(server: Server, model: str, body: object, words: str) -> None:
    reply = predict(server, model, body)
    assert reply.status_code == 400, reply.text
    assert words in reply.json()["error"]


def test_bad_json_unknown_model_and_explain_refusal(server: Server) -> None:
    reply = httpx.post(f"{server.url}/v1/models/xgb:predict", content=b"{not json", timeout=10)
    assert reply.status_code == 400
    assert reply.json()["error"].startswith("Unrecognized request format")
    reply = predict(server, "nope", {"instances": [[1.0]]})
    assert (reply.status_code, reply.json()) == (
        404, {"error": "Model with name nope does not exist."}
    )  # fmt: skip
    # As KServe's routes: a GET of ":predict" asks for the readiness of a model so named.
    reply = httpx.get(f"{server.url}/v1/models/xgb:predict", timeout=10)
    assert (reply.status_code, reply.json()) == (
        404, {"error": "Model with name xgb:predict does not exist."}
    )  # fmt: skip
    # The text pipeline has no explanation: a 400 saying why, never a 500.
    reply = httpx.post(
        f"{server.url}/v1/models/sk-text:explain", json={"instances": ["good"]}, timeout=30
    )
    assert reply.status_code == 400, reply.text
    assert "cannot explain" in reply.json()["error"]
