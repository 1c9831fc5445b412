"""MLServer custom runtimes served by inferpool without MLServer: the sources of
``tests/mlserver/runtimes.py`` with only their import lines rewritten to
``inferpool.mlserver``, asked over REST and gRPC, in worker processes and in-process."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.mlserver.runtimes import (
    CASES,
    SCALER_OUTPUT,
    SCALER_REQUEST,
    TOTALS_REQUEST,
    grpc_outputs,
    grpc_request,
    write_repository,
)
from tests.support import Server
from tests.support.grpc import stub_for


@pytest.fixture(scope="module", params=["1", "0"], ids=["workers", "in-process"])
def server(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Server]:
    repository = write_repository(tmp_path_factory.mktemp("mlmodel"), rewrite=True)
    with Server(repository, "--workers", request.param) as running:
        running.wait_ready()
        yield running


@pytest.mark.parametrize(("model", "body", "outputs"), CASES, ids=[c[0] for c in CASES])
def test_rest_answer_is_the_runtimes_response(server: Server, model, body, outputs) -> None:
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == outputs


@pytest.mark.parametrize(("model", "body", "outputs"), CASES, ids=[c[0] for c in CASES])
def test_grpc_answer_is_the_runtimes_response(server: Server, model, body, outputs) -> None:
    with stub_for(server) as stub:
        response = stub.ModelInfer(grpc_request(model, body), timeout=30)
    assert grpc_outputs(response) == outputs


def test_response_parameters_and_version_come_from_the_runtime(server: Server) -> None:
    body = httpx.post(f"{server.url}/v2/models/totals/infer", json=TOTALS_REQUEST).json()
    assert body["parameters"] == {"content_type": "pd"}  # PandasCodec.encode_response's
    scaled = httpx.post(f"{server.url}/v2/models/scaler/infer", json=SCALER_REQUEST).json()
    assert scaled["model_version"] == "v1"  # self.version, from parameters.version


def test_outputs_requested_by_name_reach_the_runtime(server: Server) -> None:
    # MLServer passes request.outputs to predict; the model declares none in its settings.
    body = {**SCALER_REQUEST, "outputs": [{"name": "scaled"}]}
    response = httpx.post(f"{server.url}/v2/models/scaler/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == [SCALER_OUTPUT]


def test_inference_error_is_a_400_with_its_message(server: Server) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [-1]}]}
    response = httpx.post(f"{server.url}/v2/models/scaler/infer", json=body)
    assert response.status_code == 400
    assert response.json() == {"error": "negative values cannot be scaled"}
    request = grpc_request("scaler", body)
    with stub_for(server) as stub, pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(request, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == "negative values cannot be scaled"


def test_decode_args_refuses_an_input_it_has_no_argument_for(server: Server) -> None:
    body = {"inputs": [{"name": "who", "datatype": "INT32", "shape": [1], "data": [1]}]}
    response = httpx.post(f"{server.url}/v2/models/greeter/infer", json=body)
    assert response.status_code == 400
    assert response.json() == {
        "error": "Input 'who' was not found. Available inputs are 'name', 'times'."
    }


def test_metadata_is_the_runtimes(server: Server) -> None:
    metadata = httpx.get(f"{server.url}/v2/models/greeter").json()
    assert metadata["name"] == "greeter"
    assert metadata["platform"] == ""  # MLModel.metadata(): settings.platform
    assert metadata["inputs"] == [] and metadata["outputs"] == []
    with stub_for(server) as stub:
        answer = stub.ModelMetadata(pb.ModelMetadataRequest(name="scaler"), timeout=30)
    assert (answer.name, list(answer.versions), answer.platform) == ("scaler", ["v1"], "")
