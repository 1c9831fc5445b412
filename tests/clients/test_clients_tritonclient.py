"""The newest tritonclient (installed beside inferpool by tox's ``clients`` environment,
protobuf 6) against live servers: HTTP with binary and JSON tensors, and gRPC's inference,
health, metadata, statistics and repository index."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import joblib
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.support import Server, iris_data

MODEL = "iris-rf"


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    X, _ = iris_data()
    return X[::9].astype(np.float32)


@pytest.fixture(scope="module")
def estimator(clients_repository: Path):
    return joblib.load(clients_repository / MODEL / "model.joblib")


@pytest.fixture(scope="module")
def http_client(clients_server: Server) -> Iterator[triton_http.InferenceServerClient]:
    client = triton_http.InferenceServerClient(clients_server.url.removeprefix("http://"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(clients_server: Server) -> Iterator[triton_grpc.InferenceServerClient]:
    client = triton_grpc.InferenceServerClient(clients_server.grpc_address)
    yield client
    client.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_infer(http_client, estimator, rows, binary: bool) -> None:
    tensor = triton_http.InferInput("input-0", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    outputs = [
        triton_http.InferRequestedOutput(name, binary_data=binary)
        for name in ("predict", "predict_proba")
    ]

    result = http_client.infer(MODEL, [tensor], outputs=outputs)

    for name in ("predict", "predict_proba"):
        sent_binary = "binary_data_size" in result.get_output(name).get("parameters", {})
        assert sent_binary == binary, name
    assert np.array_equal(result.as_numpy("predict"), estimator.predict(rows))
    assert np.allclose(result.as_numpy("predict_proba"), estimator.predict_proba(rows))


def test_http_health_and_metadata(http_client) -> None:
    assert http_client.is_server_live()
    assert http_client.is_server_ready()
    assert http_client.is_model_ready(MODEL)
    assert not http_client.is_model_ready("no-such-model")
    metadata = http_client.get_model_metadata(MODEL)
    assert metadata["inputs"][0]["shape"] == [-1, 4]


def test_grpc_infer(grpc_client, estimator, rows) -> None:
    tensor = triton_grpc.InferInput("input-0", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    outputs = [triton_grpc.InferRequestedOutput(n) for n in ("predict", "predict_proba")]

    result = grpc_client.infer(MODEL, [tensor], outputs=outputs, request_id="grpc-1")

    assert result.get_response().id == "grpc-1"
    assert np.array_equal(result.as_numpy("predict"), estimator.predict(rows))
    assert np.allclose(result.as_numpy("predict_proba"), estimator.predict_proba(rows))


def test_grpc_health_and_metadata(grpc_client) -> None:
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()
    assert grpc_client.is_model_ready(MODEL)
    with pytest.raises(InferenceServerException, match="not found"):
        grpc_client.is_model_ready("no-such-model")
    metadata = grpc_client.get_model_metadata(MODEL, as_json=True)
    assert metadata["name"] == MODEL
    assert metadata["inputs"] == [{"name": "input-0", "datatype": "FP64", "shape": ["-1", "4"]}]
    assert [o["name"] for o in metadata["outputs"]][:2] == ["predict", "predict_proba"]
    assert grpc_client.get_server_metadata(as_json=True)["name"] == "inferpool"


def test_grpc_statistics_count_requests(grpc_client, rows) -> None:
    def successes() -> int:
        stats = grpc_client.get_inference_statistics(MODEL, as_json=True)["model_stats"]
        return int(stats[0]["inference_stats"]["success"].get("count", 0))

    before = successes()
    tensor = triton_grpc.InferInput("input-0", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    grpc_client.infer(MODEL, [tensor])

    assert successes() == before + 1


def test_grpc_repository_index(grpc_client) -> None:
    index = grpc_client.get_model_repository_index(as_json=True)["models"]
    assert {(m["name"], m.get("state")) for m in index} >= {
        ("iris-logreg", "READY"),
        (MODEL, "READY"),
    }
