"""ModelInfer over gRPC: every datatype in typed and raw form, strings, requested outputs."""

from __future__ import annotations

import grpc
import joblib
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2 as triton_pb

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import iris_data
from tests.support.grpc import (
    SAMPLES,
    SETUPS,
    TYPED_FIELD,
    infer_request,
    setup_server,
    stub_for,
)


@pytest.fixture(scope="module", params=SETUPS)
def server(request, tmp_path_factory):
    with setup_server(request.param, tmp_path_factory.mktemp("grpc-infer")) as server:
        yield server


@pytest.fixture(scope="module")
def stub(server):
    with stub_for(server) as stub:
        yield stub


@pytest.fixture(scope="module")
def triton_client(server):
    client = triton.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_typed_contents_round_trip(stub, datatype):
    values = SAMPLES[datatype]
    request = pb.ModelInferRequest(model_name="echo")
    tensor = request.inputs.add(name="a", datatype=datatype, shape=values.shape)
    getattr(tensor.contents, TYPED_FIELD[datatype]).extend(values.ravel().tolist())

    response = stub.ModelInfer(request)

    assert not response.raw_output_contents, "typed inputs get typed outputs"
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("a", datatype, [2, 2])
    assert list(getattr(output.contents, TYPED_FIELD[datatype])) == values.ravel().tolist()


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_raw_contents_round_trip_with_tritonclient(triton_client, datatype):
    values = SAMPLES[datatype]
    tensor = triton.InferInput("a", list(values.shape), datatype)
    tensor.set_data_from_numpy(values)

    result = triton_client.infer("echo", [tensor])

    assert len(result.get_response().raw_output_contents) == 1, "raw inputs get raw outputs"
    got = result.as_numpy("a")
    assert got.dtype == values.dtype
    assert got.shape == values.shape
    assert np.array_equal(got, values)


def test_several_raw_inputs_keep_their_order(triton_client):
    a = triton.InferInput("a", [3], "INT32")
    a.set_data_from_numpy(np.array([1, 2, 3], np.int32))
    b = triton.InferInput("b", [1, 2], "BYTES")
    b.set_data_from_numpy(np.array([[b"x", b"yz"]], dtype=object))

    result = triton_client.infer("echo", [a, b])

    assert np.array_equal(result.as_numpy("a"), [1, 2, 3])
    assert result.as_numpy("b").tolist() == [[b"x", b"yz"]]


def test_bytes_as_utf8_strings(stub):
    words = ["héllo", "wörld", "日本"]
    request = pb.ModelInferRequest(model_name="echo")
    tensor = request.inputs.add(name="a", datatype="BYTES", shape=[3])
    tensor.parameters["content_type"].string_param = "str"
    tensor.contents.bytes_contents.extend(word.encode() for word in words)

    response = stub.ModelInfer(request)

    (output,) = response.outputs
    assert output.datatype == "BYTES"
    assert [item.decode() for item in output.contents.bytes_contents] == words


def test_requested_outputs_only(stub):
    request = pb.ModelInferRequest(model_name="echo")
    for name in ("a", "b"):
        tensor = request.inputs.add(name=name, datatype="INT64", shape=[1])
        tensor.contents.int64_contents.append(7)
    request.outputs.add(name="b")

    response = stub.ModelInfer(request)

    assert [output.name for output in response.outputs] == ["b"]


def test_predict_proba_typed_matches_the_estimator(server, stub):
    X, _ = iris_data()
    estimator = joblib.load(server.repository / "iris-logreg" / "model.joblib")
    request = infer_request("iris-logreg", x=X[:5])
    request.id = "my-request"
    request.outputs.add(name="predict_proba")

    response = stub.ModelInfer(request)

    assert (response.model_name, response.id) == ("iris-logreg", "my-request")
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("predict_proba", "FP64", [5, 3])
    got = np.array(output.contents.fp64_contents).reshape(5, 3)
    assert np.allclose(got, estimator.predict_proba(X[:5]))


def test_raw_batch_of_256_with_tritonclient(server, triton_client):
    X, _ = iris_data()
    batch = np.resize(X, (256, 4)).astype(np.float32)
    estimator = joblib.load(server.repository / "iris-rf" / "model.joblib")
    tensor = triton.InferInput("x", [256, 4], "FP32")
    tensor.set_data_from_numpy(batch)
    outputs = [triton.InferRequestedOutput(n) for n in ("predict", "predict_proba")]

    result = triton_client.infer("iris-rf", [tensor], outputs=outputs)

    assert np.array_equal(result.as_numpy("predict"), estimator.predict(batch))
    assert np.allclose(result.as_numpy("predict_proba"), estimator.predict_proba(batch))


def test_tritonclient_health_and_metadata(triton_client):
    assert triton_client.is_server_live()
    assert triton_client.is_server_ready()
    assert triton_client.is_model_ready("iris-logreg")
    metadata = triton_client.get_model_metadata("iris-logreg", as_json=True)
    assert metadata["name"] == "iris-logreg"
    assert metadata["platform"] == "sklearn"
    assert metadata["inputs"] == [{"name": "input-0", "datatype": "FP64", "shape": ["-1", "4"]}]
    names = [output["name"] for output in metadata["outputs"]]
    assert names[:2] == ["predict", "predict_proba"]


def test_a_request_built_with_tritons_own_messages(server):
    """Triton's perf tools send its service_pb2 messages; they must parse as ours."""
    X, _ = iris_data()
    request = triton_pb.ModelInferRequest(model_name="iris-logreg", model_version="")
    request.inputs.add(name="x", datatype="FP64", shape=[2, 4])
    request.raw_input_contents.append(X[:2].astype("<f8").tobytes())
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=triton_pb.ModelInferRequest.SerializeToString,
            response_deserializer=triton_pb.ModelInferResponse.FromString,
        )
        response = call(request)

    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("predict", "INT64", [2])
    assert np.frombuffer(response.raw_output_contents[0], "<i8").tolist() == [0, 0]


def test_messages_larger_than_grpcs_4_mib_default(triton_client):
    values = np.arange(1_500_000, dtype=np.int64)  # 12 MB each way
    tensor = triton.InferInput("a", [values.size], "INT64")
    tensor.set_data_from_numpy(values)

    result = triton_client.infer("echo", [tensor])

    assert np.array_equal(result.as_numpy("a"), values)
