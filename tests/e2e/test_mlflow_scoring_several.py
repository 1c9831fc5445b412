"""MLflow's root scoring routes in a server of several models answer for its only MLflow
model, as MLServer's MLflow runtime (which registers them at the root) does; with two
MLflow models they answer 404 naming them. Its V2 metadata is MLServer's too: content
types per tensor and for the model, columns of shape ``[-1, 1]``, over REST and gRPC."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pandas as pd
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.e2e.test_runtime_mlflow import PRICE_MODEL, PRICES, save_from_code
from tests.support import Server, build_iris_repository

RECORDS = {"dataframe_records": PRICES.to_dict(orient="records")}


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    from mlflow.models import infer_signature

    root = build_iris_repository(tmp_path_factory.mktemp("several") / "repo")
    expected = pd.DataFrame({"total": PRICES.price * PRICES.quantity, "label": PRICES.city})
    save_from_code(root / "prices", PRICE_MODEL, infer_signature(PRICES, expected))
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[Server]:
    with Server(repository, "--workers", "0") as running:
        running.wait_ready(timeout=120)
        yield running


def test_invocations_answer_for_the_only_mlflow_model(server: Server) -> None:
    response = httpx.post(f"{server.url}/invocations", json=RECORDS, timeout=60)
    assert response.status_code == 200, response.text
    totals = [row["total"] for row in response.json()["predictions"]]
    assert totals == [5.0, 12.0, 10.0]
    assert httpx.get(f"{server.url}/ping").status_code == 200
    # Every model keeps its own route.
    rows = {"inputs": [[5.1, 3.5, 1.4, 0.2]]}
    other = httpx.post(f"{server.url}/v2/models/iris-rf/invocations", json=rows, timeout=60)
    assert other.status_code == 200 and other.json() == {"predictions": [0]}


def test_two_mlflow_models_answer_404_naming_them(repository: Path, tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(repository, root)
    shutil.copytree(repository / "prices", root / "prices-2")
    with Server(root, "--workers", "0") as running:
        running.wait_ready(timeout=120)
        response = httpx.post(f"{running.url}/invocations", json=RECORDS, timeout=60)
    assert response.status_code == 404
    assert response.json()["message"] == (
        "MLflow's scoring endpoints answer for the server's only model or its only MLflow "
        "model; this one serves 4 models (iris-logreg, iris-rf, prices, prices-2), 2 of them "
        "MLflow models: use /v2/models/{name}/invocations"
    )


def test_metadata_is_mlservers(server: Server) -> None:
    document = httpx.get(f"{server.url}/v2/models/prices").json()
    assert document["parameters"] == {"content_type": "pd"}
    np_column, str_column = {"content_type": "np"}, {"content_type": "str"}
    assert document["inputs"] == [
        {"name": "price", "datatype": "FP64", "shape": [-1, 1], "parameters": np_column},
        {"name": "quantity", "datatype": "INT64", "shape": [-1, 1], "parameters": np_column},
        {"name": "city", "datatype": "BYTES", "shape": [-1, 1], "parameters": str_column},
    ]
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        answer = stub.ModelMetadata(pb.ModelMetadataRequest(name="prices"), timeout=30)
    assert answer.parameters["content_type"].string_param == "pd"
    price = answer.inputs[0]
    assert (price.name, list(price.shape)) == ("price", [-1, 1])
    assert price.parameters["content_type"].string_param == "np"
    # Requests as before: the column types still decode (a V2 request of flat columns).
    body = {
        "inputs": [
            {"name": "price", "datatype": "FP64", "shape": [3, 1], "data": [2.5, 4.0, 10.0]},
            {"name": "quantity", "datatype": "INT64", "shape": [3, 1], "data": [2, 3, 1]},
            {"name": "city", "datatype": "BYTES", "shape": [3, 1], "data": ["a", "b", "c"]},
        ]
    }
    response = httpx.post(f"{server.url}/v2/models/prices/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    totals = {o["name"]: o["data"] for o in response.json()["outputs"]}["total"]
    assert totals == [5.0, 12.0, 10.0]
