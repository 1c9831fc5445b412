"""MLflow models served over V2 REST and MLflow's own scoring API (``/invocations``):
signatures as metadata, DataFrame / array / dict payloads, and the 400s."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from tests.support import Server, iris_data
from tests.support.runtimes import output_array

# Models from code: MLflow copies the file into the model folder and runs it at load.
PRICE_MODEL = """
import mlflow
import pandas as pd


class Price(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        discount = (params or {}).get("discount", 0.0)
        total = model_input["price"] * model_input["quantity"] * (1 - discount)
        return pd.DataFrame({"total": total, "label": model_input["city"].str.upper()})


mlflow.models.set_model(Price())
"""

TENSOR_MODEL = """
import mlflow
import numpy as np


class Scale(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        x, factor = model_input["x"], model_input["factor"]
        return {"scaled": x * factor, "norm": np.linalg.norm(x, axis=1)}


mlflow.models.set_model(Scale())
"""

# No signature: it reports what it was given, to show the request chooses the payload.
ECHO_MODEL = """
import mlflow
import numpy as np


class Echo(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return np.array([type(model_input).__name__])


mlflow.models.set_model(Echo())
"""

PRICES = pd.DataFrame(
    {"price": [2.5, 4.0, 10.0], "quantity": [2, 3, 1], "city": ["paris", "oslo", "rome"]}
)


def save_from_code(folder: Path, code: str, signature=None) -> None:
    import mlflow.pyfunc

    source = folder.parent / f"{folder.name}_code.py"
    source.write_text(textwrap.dedent(code))
    mlflow.pyfunc.save_model(
        str(folder), python_model=str(source), signature=signature, pip_requirements=[]
    )


def build_repository(root: Path) -> dict:
    import mlflow.sklearn
    from mlflow.models import infer_signature
    from sklearn.linear_model import LogisticRegression

    expected = pd.DataFrame(
        {"total": PRICES.price * PRICES.quantity, "label": PRICES.city.str.upper()}
    )
    signature = infer_signature(PRICES, expected, params={"discount": 0.0})
    save_from_code(root / "prices", PRICE_MODEL, signature)

    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    tensors = {"x": x, "factor": np.array([[2.0], [3.0]])}
    outputs = {"scaled": x * tensors["factor"], "norm": np.linalg.norm(x, axis=1)}
    save_from_code(root / "tensors", TENSOR_MODEL, infer_signature(tensors, outputs))
    save_from_code(root / "echo", ECHO_MODEL)

    X, y = iris_data()
    classifier = LogisticRegression(max_iter=1000).fit(X, y)
    mlflow.sklearn.save_model(
        classifier,
        str(root / "iris"),
        signature=infer_signature(X, classifier.predict(X)),
        pip_requirements=[],
        serialization_format=mlflow.sklearn.SERIALIZATION_FORMAT_CLOUDPICKLE,
    )
    return {"classifier": classifier, "X": X, "tensors": tensors}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict]]:
    root = tmp_path_factory.mktemp("mlflow")
    data = build_repository(root)
    with Server(root, "--workers", "0") as server:
        server.wait_ready(timeout=120)
        yield server, data


def post(server: Server, path: str, body) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def price_inputs(frame: pd.DataFrame) -> list[dict]:
    datatypes = {"price": "FP64", "quantity": "INT64", "city": "BYTES"}
    return [
        {"name": name, "shape": [len(frame)], "datatype": datatype, "data": frame[name].tolist()}
        for name, datatype in datatypes.items()
    ]


def test_signature_becomes_metadata(mlflow_server):
    server, _ = mlflow_server
    metadata = httpx.get(f"{server.url}/v2/models/prices").json()
    assert metadata["platform"] == "mlflow"
    inputs = {spec["name"]: spec for spec in metadata["inputs"]}
    assert inputs["price"]["datatype"] == "FP64"
    assert inputs["quantity"]["datatype"] == "INT64"
    assert inputs["city"]["datatype"] == "BYTES"
    assert inputs["city"]["parameters"]["content_type"] == "str"
    assert [o["name"] for o in metadata["outputs"]] == ["total", "label"]

    tensors = httpx.get(f"{server.url}/v2/models/tensors").json()
    assert {s["name"]: s["shape"] for s in tensors["inputs"]} == {"x": [-1, 3], "factor": [-1, 1]}


def test_v2_request_becomes_a_dataframe(mlflow_server):
    server, _ = mlflow_server
    response = post(server, "/v2/models/prices/infer", {"inputs": price_inputs(PRICES)})
    assert response.status_code == 200, response.text
    document = response.json()
    assert output_array(document, "total").tolist() == [5.0, 12.0, 10.0]
    assert output_array(document, "label").tolist() == ["PARIS", "OSLO", "ROME"]


def test_one_output_can_be_selected(mlflow_server):
    server, _ = mlflow_server
    body = {"inputs": price_inputs(PRICES), "outputs": [{"name": "label"}]}
    response = post(server, "/v2/models/prices/infer", body)
    assert [o["name"] for o in response.json()["outputs"]] == ["label"]


def test_tensor_signature_gets_a_dict_of_tensors(mlflow_server):
    server, data = mlflow_server
    x, factor = data["tensors"]["x"], data["tensors"]["factor"]
    body = {
        "inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP64", "data": x.ravel().tolist()},
            {
                "name": "factor",
                "shape": [2, 1],
                "datatype": "FP64",
                "data": factor.ravel().tolist(),
            },
        ]
    }
    response = post(server, "/v2/models/tensors/infer", body)
    assert response.status_code == 200, response.text
    assert np.allclose(output_array(response.json(), "scaled"), x * factor)
    assert np.allclose(output_array(response.json(), "norm"), np.linalg.norm(x, axis=1))


def test_sklearn_flavour_matches_the_estimator(mlflow_server):
    server, data = mlflow_server
    X = data["X"][40:60]
    body = {
        "inputs": [
            {"name": "x", "shape": list(X.shape), "datatype": "FP64", "data": X.ravel().tolist()}
        ]
    }
    response = post(server, "/v2/models/iris/infer", body)
    assert response.status_code == 200, response.text
    predicted = output_array(response.json(), response.json()["outputs"][0]["name"])
    assert np.array_equal(predicted.ravel(), data["classifier"].predict(X))


@pytest.mark.parametrize(("content_type", "received"), [(None, "DataFrame"), ("dict", "dict")])
def test_request_parameter_chooses_the_payload(mlflow_server, content_type, received):
    server, _ = mlflow_server
    body: dict = {"inputs": [{"name": "a", "shape": [1], "datatype": "FP64", "data": [1.0]}]}
    if content_type:
        body["parameters"] = {"content_type": content_type}
    response = post(server, "/v2/models/echo/infer", body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [received]


@pytest.mark.parametrize(
    "payload",
    [
        {"dataframe_split": PRICES.to_dict(orient="split")},
        {"dataframe_records": PRICES.to_dict(orient="records")},
        {"instances": PRICES.to_dict(orient="records")},
        {"inputs": PRICES.to_dict(orient="list")},
    ],
    ids=["dataframe_split", "dataframe_records", "instances", "inputs"],
)
def test_mlflow_scoring_api(mlflow_server, payload):
    server, _ = mlflow_server
    response = post(server, "/v2/models/prices/invocations", payload)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "predictions": [
            {"total": 5.0, "label": "PARIS"},
            {"total": 12.0, "label": "OSLO"},
            {"total": 10.0, "label": "ROME"},
        ]
    }


def test_mlflow_scoring_api_passes_params(mlflow_server):
    server, _ = mlflow_server
    body = {
        "dataframe_records": PRICES.iloc[:1].to_dict(orient="records"),
        "params": {"discount": 0.5},
    }
    response = post(server, "/v2/models/prices/invocations", body)
    assert response.status_code == 200, response.text
    assert response.json()["predictions"][0]["total"] == 2.5


def test_mlflow_scoring_api_for_a_tensor_model(mlflow_server):
    server, data = mlflow_server
    X = data["X"][:5]
    response = post(server, "/v2/models/iris/invocations", {"instances": X.tolist()})
    assert response.status_code == 200, response.text
    assert response.json() == {"predictions": data["classifier"].predict(X).tolist()}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"records": []}, "expected exactly one of dataframe_records, dataframe_split"),
        ({"dataframe_records": [{"price": 1.0, "city": "x"}]}, "missing inputs ['quantity']"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_mlflow_scoring_api_bad_input_is_400(mlflow_server, body, message):
    server, _ = mlflow_server
    response = post(server, "/v2/models/prices/invocations", body)
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_unknown_input_is_400_listing_the_signature(mlflow_server):
    server, _ = mlflow_server
    inputs = price_inputs(PRICES)
    inputs[1]["name"] = "qty"
    response = post(server, "/v2/models/prices/infer", {"inputs": inputs})
    assert response.status_code == 400
    assert (
        response.json()["error"]
        == "model 'prices' has no input 'qty'; expected: price, quantity, city"
    )


def test_wrong_shape_for_a_tensor_model_is_400(mlflow_server):
    server, _ = mlflow_server
    body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64", "data": [1.0, 2.0, 3.0]}]}
    response = post(server, "/v2/models/iris/infer", body)
    assert response.status_code == 400
    assert "expects an input of shape [-1, 4], got [1, 3]" in response.json()["error"]
