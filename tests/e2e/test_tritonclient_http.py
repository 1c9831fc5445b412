"""Triton's own HTTP client works against the server as it would against Triton."""

from __future__ import annotations

import joblib
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.support import iris_data


@pytest.fixture(scope="module")
def client(iris_server):
    return triton.InferenceServerClient(url=iris_server.url.removeprefix("http://"))


def test_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("iris-logreg")
    assert not client.is_model_ready("no-such-model")
    metadata = client.get_model_metadata("iris-logreg")
    assert metadata["inputs"][0]["shape"] == [-1, 4]
    assert {o["name"] for o in metadata["outputs"]} >= {"predict", "predict_proba"}
    assert client.get_server_metadata()["name"] == "inferpool"


@pytest.mark.parametrize("model", ["iris-logreg", "iris-rf"])
def test_infer_with_numpy_inputs(client, iris_repo, model):
    estimator = joblib.load(iris_repo / model / "model.joblib")
    X, _ = iris_data()
    rows = X[::7].astype(np.float32)
    tensor = triton.InferInput("input-0", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=False)
    outputs = [
        triton.InferRequestedOutput("predict", binary_data=False),
        triton.InferRequestedOutput("predict_proba", binary_data=False),
    ]
    result = client.infer(model, [tensor], outputs=outputs, request_id="triton-1")
    assert result.get_response()["id"] == "triton-1"
    assert np.array_equal(result.as_numpy("predict"), estimator.predict(rows))
    proba = result.as_numpy("predict_proba")
    assert proba.shape == (len(rows), 3)
    assert np.allclose(proba, estimator.predict_proba(rows))


def test_errors_surface_as_client_exceptions(client):
    tensor = triton.InferInput("input-0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), np.float32), binary_data=False)
    with pytest.raises(InferenceServerException, match="4 features"):
        client.infer("iris-logreg", [tensor])
    with pytest.raises(InferenceServerException, match="not found"):
        client.infer("missing", [tensor])
