"""The core V2 REST endpoints against a scikit-learn model repository (``--workers 0``)."""

from __future__ import annotations

import joblib
import numpy as np
import pytest

from tests.support import iris_data


@pytest.fixture(scope="module")
def http(iris_server):
    import httpx

    with httpx.Client(base_url=iris_server.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def estimators(iris_repo):
    return {
        name: joblib.load(iris_repo / name / "model.joblib") for name in ("iris-logreg", "iris-rf")
    }


def infer_body(rows, **extra):
    rows = np.asarray(rows, dtype=np.float64)
    tensor = {"name": "x", "shape": list(rows.shape), "datatype": "FP64", "data": rows.tolist()}
    return {"inputs": [tensor], **extra}


def test_live_ready_and_server_metadata(http):
    assert http.get("/v2/health/live").json() == {"live": True}
    ready = http.get("/v2/health/ready")
    assert ready.status_code == 200 and ready.json() == {"ready": True}
    metadata = http.get("/v2").json()
    assert metadata["name"] == "inferpool"
    assert metadata["version"]
    assert "model_repository" in metadata["extensions"]


def test_model_metadata_is_derived_from_the_estimator(http):
    metadata = http.get("/v2/models/iris-logreg").json()
    assert metadata["name"] == "iris-logreg"
    assert metadata["platform"] == "sklearn"
    assert metadata["inputs"] == [{"name": "input-0", "datatype": "FP64", "shape": [-1, 4]}]
    outputs = {o["name"]: o for o in metadata["outputs"]}
    assert set(outputs) == {"predict", "predict_proba", "decision_function"}
    assert outputs["predict"]["datatype"] == "INT64"
    assert outputs["predict_proba"]["shape"] == [-1, 3]
    rf_outputs = {o["name"] for o in http.get("/v2/models/iris-rf").json()["outputs"]}
    assert rf_outputs == {"predict", "predict_proba"}


def test_model_ready(http):
    response = http.get("/v2/models/iris-rf/ready")
    assert response.status_code == 200
    assert response.json() == {"name": "iris-rf", "ready": True}


@pytest.mark.parametrize("model", ["iris-logreg", "iris-rf"])
def test_predict_matches_the_estimator(http, estimators, model):
    X, _ = iris_data()
    rows = X[::10]
    response = http.post(f"/v2/models/{model}/infer", json=infer_body(rows))
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["name"] == "predict"
    assert output["datatype"] == "INT64"
    assert output["shape"] == [len(rows)]
    assert output["data"] == estimators[model].predict(rows).tolist()


def test_requested_outputs_are_flat_row_major(http, estimators):
    X, _ = iris_data()
    rows = X[40:60]
    body = infer_body(rows, outputs=[{"name": "predict_proba"}, {"name": "decision_function"}])
    outputs = http.post("/v2/models/iris-logreg/infer", json=body).json()["outputs"]
    assert [o["name"] for o in outputs] == ["predict_proba", "decision_function"]
    proba, decision = outputs
    assert proba["shape"] == [20, 3] and proba["datatype"] == "FP64"
    expected = estimators["iris-logreg"].predict_proba(rows)
    assert np.allclose(proba["data"], expected.reshape(-1))
    assert isinstance(proba["data"][0], float)
    expected = estimators["iris-logreg"].decision_function(rows).reshape(-1)
    assert np.allclose(decision["data"], expected)


def test_flat_and_nested_data_agree(http):
    X, _ = iris_data()
    rows = X[95:105]
    nested = http.post("/v2/models/iris-rf/infer", json=infer_body(rows)).json()
    flat_body = {
        "inputs": [
            {"name": "x", "shape": [10, 4], "datatype": "FP32", "data": rows.ravel().tolist()}
        ]
    }
    flat = http.post("/v2/models/iris-rf/infer", json=flat_body).json()
    assert flat["outputs"][0]["data"] == nested["outputs"][0]["data"]


def test_request_id_is_echoed_or_generated_and_parameters_pass_through(http):
    body = infer_body([[5.1, 3.5, 1.4, 0.2]], id="my-request-7", parameters={"trace": "abc"})
    response = http.post("/v2/models/iris-logreg/infer", json=body).json()
    assert response["id"] == "my-request-7"
    assert response["parameters"]["trace"] == "abc"
    assert response["model_name"] == "iris-logreg"
    generated = http.post("/v2/models/iris-logreg/infer", json=infer_body([[1, 2, 3, 4]])).json()
    other = http.post("/v2/models/iris-logreg/infer", json=infer_body([[1, 2, 3, 4]])).json()
    assert generated["id"] and other["id"] and generated["id"] != other["id"]


def test_transform_is_served_for_transformers(tmp_path):
    from sklearn.decomposition import PCA

    from tests.support import Server, write_sklearn_model

    X, _ = iris_data()
    pca = PCA(n_components=2).fit(X)
    write_sklearn_model(tmp_path / "pca", pca, "model.pkl")
    with Server(tmp_path, "--workers", "0") as server:
        server.wait_ready()
        import httpx

        body = infer_body(X[:5], outputs=[{"name": "transform"}])
        output = httpx.post(f"{server.url}/v2/models/pca/infer", json=body).json()["outputs"][0]
    assert output["shape"] == [5, 2]
    assert np.allclose(output["data"], pca.transform(X[:5]).reshape(-1))
