"""MLServer 1.7.1's docs/examples/catboost served by inferpool and by ``mlserver start``
side by side: the model trained as the example's README trains it (in the folder, so
CatBoost's ``catboost_info/`` lies beside it), its ``settings.json`` and root
``model-settings.json`` (``mlserver_catboost.CatboostModel``), its request (one FP32 row
named ``predict-prob``) and a request of several rows, over REST and gRPC: the status
and each output's name, datatype, shape and data are the same.

Run by tox's ``mlserver`` environment (mlserver-catboost and catboost installed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.mlserver.runtimes import grpc_outputs, grpc_request
from tests.runtimes.catboost_models import tensor
from tests.support import Server
from tests.support.mlserver import running_mlserver

catboost = pytest.importorskip("catboost")
pytest.importorskip("mlserver_catboost")

PATH = "/v2/models/catboost/versions/v0.1.0/infer"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's folder, as its README makes it."""
    root = tmp_path_factory.mktemp("catboost-example")
    rng = np.random.default_rng(0)
    train_data = rng.integers(0, 100, size=(100, 10))
    train_labels = rng.integers(0, 2, size=(100))
    model = catboost.CatBoostClassifier(
        iterations=2,
        depth=2,
        learning_rate=1,
        loss_function="Logloss",
        verbose=True,
        train_dir=str(root / "catboost_info"),
    )
    model.fit(train_data, train_labels)
    model.save_model(str(root / "model.cbm"))
    (root / "settings.json").write_text(json.dumps({"debug": "true"}))
    settings = {
        "name": "catboost",
        "implementation": "mlserver_catboost.CatboostModel",
        "parameters": {"uri": "./model.cbm", "version": "v0.1.0"},
    }
    (root / "model-settings.json").write_text(json.dumps(settings))
    assert (root / "catboost_info").is_dir()
    return root


@pytest.fixture(scope="module")
def both(example: Path) -> Iterator[tuple[Server, tuple[str, str]]]:
    with Server(example, "--workers", "0") as ours, running_mlserver(example) as theirs:
        ours.wait_ready(timeout=300)  # generous: a loaded machine
        yield ours, theirs


def request_of(rows: np.ndarray) -> dict:
    """The README's request for ``rows``."""
    return {"inputs": [tensor("predict-prob", rows, "FP32")]}


REQUESTS = {
    "readme": request_of(np.random.default_rng(1).integers(0, 100, size=(1, 10))),
    "rows": request_of(np.random.default_rng(2).integers(0, 100, size=(7, 10))),
}


def comparable(outputs: list[dict]) -> list[tuple]:
    return [(o["name"], o["datatype"], o["shape"], o["data"]) for o in outputs]


@pytest.mark.parametrize("name", list(REQUESTS))
def test_rest_answers_as_mlserver(both, name: str) -> None:
    ours, (theirs, _) = both
    mine = httpx.post(ours.url + PATH, json=REQUESTS[name], timeout=60)
    other = httpx.post(theirs + PATH, json=REQUESTS[name], timeout=60)
    assert mine.status_code == other.status_code == 200, (mine.text, other.text)
    assert comparable(mine.json()["outputs"]) == comparable(other.json()["outputs"])
    assert mine.json()["model_version"] == other.json()["model_version"] == "v0.1.0"
    (output,) = other.json()["outputs"]  # MLServer's: CatBoostClassifier.predict's labels
    assert (output["name"], output["datatype"]) == ("predict", "INT64")
    assert set(output["data"]) <= {0, 1}


def _grpc(address: str, body: dict) -> list[dict]:
    request = grpc_request("catboost", body)
    request.model_version = "v0.1.0"
    with grpc.insecure_channel(address) as channel:
        return grpc_outputs(GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60))


@pytest.mark.parametrize("name", list(REQUESTS))
def test_grpc_answers_as_mlserver(both, name: str) -> None:
    ours, (_, theirs) = both
    mine = _grpc(ours.grpc_address, REQUESTS[name])
    assert comparable(mine) == comparable(_grpc(theirs, REQUESTS[name]))
    assert mine[0]["shape"] == [len(REQUESTS[name]["inputs"][0]["data"]) // 10, 1]


def test_catboost_info_is_a_folder_of_the_model(both) -> None:
    ours, _ = both
    index = httpx.post(f"{ours.url}/v2/repository/index", json={}, timeout=10).json()
    assert [entry["name"] for entry in index] == ["catboost"]
