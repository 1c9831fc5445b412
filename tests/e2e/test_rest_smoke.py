"""The server answers the core V2 REST endpoints for scikit-learn models."""

import httpx
import numpy as np

from tests.support import iris_data


def test_infer_matches_estimator(iris_server):
    X, _ = iris_data()
    body = {"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP64", "data": X[:3].tolist()}]}
    response = httpx.post(f"{iris_server.url}/v2/models/iris-logreg/infer", json=body)
    assert response.status_code == 200, response.text
    output = response.json()["outputs"][0]
    assert output["name"] == "predict"
    assert output["shape"] == [3]
    assert np.array_equal(output["data"], [0, 0, 0])
