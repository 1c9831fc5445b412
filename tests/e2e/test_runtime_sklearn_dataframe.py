"""scikit-learn models fitted on DataFrames get their rows as a DataFrame with the fitted
columns, from one input per feature (any order) or one 2-D input."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pandas as pd
import pytest

from tests.support import Server
from tests.support.runtimes import output_array, rows_request, save_pickle


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict]]:
    from sklearn.compose import ColumnTransformer
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    root = tmp_path_factory.mktemp("frames")
    iris = load_iris(as_frame=True)
    X = iris.data
    numeric = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(X, iris.target)
    save_pickle(root / "iris-frame", numeric)

    # A pipeline with a text column: its input travels as BYTES with content type "str".
    mixed_X = X.assign(colour=np.where(iris.target == 0, "red", "blue"))
    encode = ColumnTransformer([("text", OneHotEncoder(), ["colour"])], remainder="passthrough")
    mixed = make_pipeline(encode, LogisticRegression(max_iter=500)).fit(mixed_X, iris.target)
    save_pickle(root / "iris-mixed", mixed)
    with Server(root, "--workers", "0") as server:
        server.wait_ready()
        yield server, {"X": X, "numeric": numeric, "mixed_X": mixed_X, "mixed": mixed}


def column_inputs(frame: pd.DataFrame, columns: list[str]) -> list[dict]:
    inputs = []
    for name in columns:
        values = frame[name].to_numpy()
        if values.dtype.kind == "O":
            inputs.append(
                {
                    "name": name,
                    "shape": [len(frame), 1],
                    "datatype": "BYTES",
                    "data": values.tolist(),
                    "parameters": {"content_type": "str"},
                }
            )
        else:
            inputs.append(
                {
                    "name": name,
                    "shape": [len(frame), 1],
                    "datatype": "FP64",
                    "data": values.tolist(),
                }
            )
    return inputs


def infer(server: Server, model: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)


def test_metadata_names_one_input_per_feature(frames):
    server, data = frames
    metadata = httpx.get(f"{server.url}/v2/models/iris-frame").json()
    assert [spec["name"] for spec in metadata["inputs"]] == list(data["X"].columns)
    assert metadata["outputs"][0]["name"] == "predict"


def test_one_input_per_feature_in_any_order(frames):
    server, data = frames
    rows = data["X"].iloc[45:60]
    columns = list(reversed(rows.columns))
    response = infer(server, "iris-frame", {"inputs": column_inputs(rows, columns)})
    assert response.status_code == 200, response.text
    expected = data["numeric"].predict(rows)
    assert np.array_equal(output_array(response.json(), "predict"), expected)


def test_one_two_dimensional_input(frames):
    server, data = frames
    rows = data["X"].iloc[45:60]
    response = infer(server, "iris-frame", rows_request(rows.to_numpy(), ["predict_proba"]))
    assert response.status_code == 200, response.text
    expected = data["numeric"].predict_proba(rows)
    assert np.allclose(output_array(response.json(), "predict_proba"), expected)


def test_pd_request_with_a_text_column(frames):
    server, data = frames
    rows = data["mixed_X"].iloc[40:60]
    body = {
        "parameters": {"content_type": "pd"},
        "inputs": column_inputs(rows, list(rows.columns)),
    }
    response = infer(server, "iris-mixed", body)
    assert response.status_code == 200, response.text
    expected = data["mixed"].predict(rows)
    assert np.array_equal(output_array(response.json(), "predict"), expected)


def test_unknown_input_is_400_listing_the_features(frames):
    server, data = frames
    rows = data["X"].iloc[:3].rename(columns={"petal width (cm)": "petal wdth"})
    response = infer(server, "iris-frame", {"inputs": column_inputs(rows, list(rows.columns))})
    assert response.status_code == 400
    error = response.json()["error"]
    assert "has no input 'petal wdth'" in error
    assert "petal width (cm)" in error


def test_missing_input_is_400(frames):
    server, data = frames
    rows = data["X"].iloc[:3]
    response = infer(server, "iris-frame", {"inputs": column_inputs(rows, list(rows.columns)[:3])})
    assert response.status_code == 400
    assert "is missing input 'petal width (cm)'" in response.json()["error"]
