"""Model repositories: artefacts recognised without settings, and MLServer's settings files."""

from __future__ import annotations

import json

import httpx
import joblib
import numpy as np
from sklearn.linear_model import LogisticRegression

from tests.support import Server, iris_data, write_sklearn_model


def test_artefacts_and_mlserver_settings_serve_unchanged(tmp_path):
    X, y = iris_data()
    estimator = LogisticRegression(max_iter=500).fit(X, y)
    write_sklearn_model(tmp_path / "as-pkl", estimator, "model.pkl")
    write_sklearn_model(tmp_path / "as-pickle", estimator, "model.pickle")
    # An MLServer model folder as MLServer documents it: a different name, a uri, a version.
    mlserver = tmp_path / "mlserver-folder"
    write_sklearn_model(mlserver, estimator, "iris-classifier.joblib")
    settings = {
        "name": "iris-mlserver",
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": "./iris-classifier.joblib", "version": "v1.2"},
        "parallel_workers": 1,
    }
    (mlserver / "model-settings.json").write_text(json.dumps(settings))
    # MLServer's server settings file is read too.
    (tmp_path / "settings.json").write_text(json.dumps({"debug": False, "parallel_workers": 0}))

    rows = X[::30]
    body = {"inputs": [{"name": "x", "shape": [5, 4], "datatype": "FP64", "data": rows.tolist()}]}
    expected = estimator.predict(rows).tolist()
    with Server(tmp_path) as server:
        server.wait_ready()
        for path in (
            "/v2/models/as-pkl",
            "/v2/models/as-pickle",
            "/v2/models/iris-mlserver",
            "/v2/models/iris-mlserver/versions/v1.2",
        ):
            response = httpx.post(f"{server.url}{path}/infer", json=body)
            assert response.status_code == 200, (path, response.text)
            assert response.json()["outputs"][0]["data"] == expected
        metadata = httpx.get(f"{server.url}/v2/models/iris-mlserver").json()
        assert metadata["versions"] == ["v1.2"]
        versioned = httpx.post(f"{server.url}/v2/models/iris-mlserver/infer", json=body).json()
        assert versioned["model_version"] == "v1.2"
        wrong = httpx.post(f"{server.url}/v2/models/iris-mlserver/versions/v9/infer", json=body)
        assert wrong.status_code == 404
        assert httpx.get(f"{server.url}/v2/models/mlserver-folder").status_code == 404


def test_settings_declare_metadata_and_bad_settings_fail_the_model(tmp_path):
    X, y = iris_data()
    folder = write_sklearn_model(tmp_path / "declared", LogisticRegression(max_iter=500).fit(X, y))
    declared = {
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "predict", "datatype": "INT64", "shape": [-1]}],
    }
    (folder / "model-settings.json").write_text(json.dumps(declared))
    bad = tmp_path / "bad-settings"
    bad.mkdir()
    (bad / "model-settings.json").write_text("{oops")
    # A folder without settings nor artefact beside settings files is no model
    # (MLServer's layout: tests/e2e/test_mlserver_examples.py); without any, it fails.
    empty = tmp_path / "no-artefact"
    empty.mkdir()
    with Server(tmp_path, "--no-exit-on-error") as server:
        server.wait_live()
        server_ready = None
        for _ in range(200):
            states = httpx.post(f"{server.url}/v2/repository/index").json()
            if all(s["state"] in ("READY", "FAILED") for s in states) and len(states) == 2:
                server_ready = httpx.get(f"{server.url}/v2/health/ready").status_code
                break
            import time

            time.sleep(0.05)
        assert server_ready == 503
        by_name = {s["name"]: s for s in states}
        assert by_name["declared"]["state"] == "READY"
        assert by_name["bad-settings"]["state"] == "FAILED"
        assert "not valid JSON" in by_name["bad-settings"]["reason"]
        assert "no-artefact" not in by_name
        metadata = httpx.get(f"{server.url}/v2/models/declared").json()
        assert metadata["inputs"] == declared["inputs"]


def test_predictions_from_the_loaded_file_match(tmp_path, iris_repo):
    estimator = joblib.load(iris_repo / "iris-rf" / "model.joblib")
    X, _ = iris_data()
    with Server(iris_repo, "--workers", "0") as server:
        server.wait_ready()
        body = {"inputs": [{"name": "x", "shape": [150, 4], "datatype": "FP64",
                            "data": X.ravel().tolist()}],
                "outputs": [{"name": "predict_proba"}]}  # fmt: skip
        output = httpx.post(f"{server.url}/v2/models/iris-rf/infer", json=body).json()
    data = np.asarray(output["outputs"][0]["data"]).reshape(150, 3)
    assert np.allclose(data, estimator.predict_proba(X))
