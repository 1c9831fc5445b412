"""Triton's model configuration extension end to end: REST ``/config`` (unversioned and
versioned), gRPC ``ModelConfig`` on both gRPC servers, Triton's own clients, and 404s."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from google.protobuf import json_format
from sklearn.linear_model import LogisticRegression
from tritonclient.utils import InferenceServerException

from inferpool.engine.states import ModelState, ModelStatus, ModelTable
from inferpool.frontends.model_config import model_config
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.settings import ServerSettings
from tests.support import Server, build_iris_repository, iris_data, write_sklearn_model

VERSIONED = "iris-batched"

IRIS_INPUT = {"name": "input-0", "data_type": "TYPE_FP64", "dims": [4]}
# Per-row outputs: a label per row is Triton's dims [1] reshaped to [].
IRIS_OUTPUTS = {
    "predict": {
        "name": "predict",
        "data_type": "TYPE_INT64",
        "dims": [1],
        "reshape": {"shape": []},
    },
    "predict_proba": {"name": "predict_proba", "data_type": "TYPE_FP64", "dims": [3]},
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_iris_repository(tmp_path_factory.mktemp("triton-config"))
    X, y = iris_data()
    folder = write_sklearn_model(root / VERSIONED, LogisticRegression(max_iter=1000).fit(X, y))
    settings = {
        "name": VERSIONED,
        "parameters": {"version": "3"},
        "max_batch_size": 8,
        "max_batch_time": 0.002,
    }
    (folder / "model-settings.json").write_text(json.dumps(settings))
    return root


@pytest.fixture(scope="module", params=["builtin", "grpcio"])
def server(repository: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    args = ["--workers", "0", "--grpc-implementation", request.param]
    with Server(repository, *args) as running:
        running.wait_ready()
        yield running


def rest_config(server: Server, path: str) -> httpx.Response:
    return httpx.get(f"{server.url}/v2/models/{path}/config")


def test_iris_config_over_rest(server: Server) -> None:
    response = rest_config(server, "iris-logreg")
    assert response.status_code == 200
    config = response.json()
    assert config["name"] == "iris-logreg"
    assert config["platform"] == "sklearn"
    # The most rows a request may hold: max_tensor_elements (2**26) over 4 features.
    assert config["max_batch_size"] == 2**26 // 4
    assert config["input"] == [IRIS_INPUT]
    outputs = {output["name"]: output for output in config["output"]}
    assert outputs["predict"]["dims"] == [1]
    assert outputs["predict_proba"] == IRIS_OUTPUTS["predict_proba"]
    assert "dynamic_batching" not in config  # this model runs each request alone
    assert config["version_policy"] == {"all": {}}


def test_batched_model_config_by_version(server: Server) -> None:
    unversioned = rest_config(server, VERSIONED).json()
    versioned = rest_config(server, f"{VERSIONED}/versions/3")
    assert versioned.status_code == 200
    assert versioned.json() == unversioned
    assert unversioned["dynamic_batching"] == {"max_queue_delay_microseconds": 2000}
    assert unversioned["input"] == [IRIS_INPUT]


@pytest.mark.parametrize(
    ("path", "message"),
    [("no-such-model", "not found"), (f"{VERSIONED}/versions/9", "version '9'")],
)
def test_unknown_model_or_version_is_404(server: Server, path: str, message: str) -> None:
    response = rest_config(server, path)
    assert response.status_code == 404
    assert message in response.json()["error"]


def test_grpc_model_config_equals_rest(server: Server) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelConfig",
            request_serializer=pb.ModelConfigRequest.SerializeToString,
            response_deserializer=pb.ModelConfigResponse.FromString,
        )
        for name, version in (("iris-logreg", ""), (VERSIONED, "3")):
            response = call(pb.ModelConfigRequest(name=name, version=version), timeout=10)
            path = name + (f"/versions/{version}" if version else "")
            expected = pb.ModelConfig()
            json_format.ParseDict(rest_config(server, path).json(), expected)
            assert response.config == expected
            assert response.config.max_batch_size > 0
        with pytest.raises(grpc.RpcError) as raised:
            call(pb.ModelConfigRequest(name="no-such-model"), timeout=10)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_triton_clients_read_the_config(server: Server) -> None:
    http_client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    config = http_client.get_model_config(VERSIONED, "3")
    assert config["max_batch_size"] > 0
    assert config["input"][0]["dims"] == [4]
    with pytest.raises(InferenceServerException, match="not found"):
        http_client.get_model_config("no-such-model")
    http_client.close()
    grpc_client = triton_grpc.InferenceServerClient(server.grpc_address)
    config = grpc_client.get_model_config(VERSIONED, "3").config
    assert config.name == VERSIONED
    assert config.input[0].data_type == triton_grpc.model_config_pb2.TYPE_FP64
    assert list(config.input[0].dims) == [4]
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    grpc_client.close()


class _Client:
    """What model_config reads of an engine client: its table and its settings."""

    def __init__(self, status: ModelStatus) -> None:
        self.table = ModelTable()
        self.table.set(status)
        self.settings = ServerSettings()


def test_a_model_without_a_batch_dimension_has_max_batch_size_0() -> None:
    metadata = {
        "platform": "custom",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1]}],
        "outputs": [{"name": "label", "datatype": "BOOL", "shape": [-1]}],
    }
    status = ModelStatus("fixed", None, ModelState.READY, metadata=metadata)
    config = model_config(_Client(status), "fixed", None)  # type: ignore[arg-type]
    assert config["max_batch_size"] == 0
    assert config["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}]
    assert config["output"] == [{"name": "label", "data_type": "TYPE_BOOL", "dims": [-1]}]
    assert "dynamic_batching" not in config
