"""MLServer 1.7.1's documentation examples, as their READMEs lay them out and call them,
served unchanged (issue 38, point 10): folders that are not models beside the model,
MLServer's loose string tensors, strings handed to a model as ``str``, the repository
API's bodies and the CloudEvents headers of REST answers.

The models are written against ``inferpool.mlserver`` (MLServer's API without MLServer);
``tests/mlserver`` runs MLServer's own beside inferpool.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from sklearn.linear_model import LogisticRegression

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, iris_data, write_custom_model, write_sklearn_model
from tests.support.grpc import stub_for

# The content-type example's EchoRuntime (docs/examples/content-type): it prints each
# input as ``json.dumps(request_input.dict(...))``, which needs its strings as ``str``;
# and custom-json's model (docs/examples/custom-json), which joins ``decode(...)``.
ECHO = """
import json

from inferpool.mlserver import MLModel
from inferpool.mlserver.codecs import DecodedParameterName, StringCodec
from inferpool.mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

_to_exclude = {
    "parameters": {DecodedParameterName, "headers"},
    "inputs": {"__all__": {"parameters": {DecodedParameterName, "headers"}}},
}


def _bytes(value):  # bytes (not str) the model was given, shown as such
    return {"bytes": value.decode("latin-1")}


class EchoRuntime(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = []
        for request_input in payload.inputs:
            try:
                joined = "".join(self.decode(request_input, default_codec=StringCodec))
            except UnicodeDecodeError:  # no UTF-8: given as bytes
                joined = None
            as_dict = request_input.dict(exclude=_to_exclude)
            seen = json.dumps({"dict": as_dict, "joined": joined}, default=_bytes)
            outputs.append(
                ResponseOutput(
                    name=request_input.name,
                    datatype="BYTES",
                    shape=[len(seen)],
                    data=[seen.encode()],
                )
            )
        return InferenceResponse(model_name=self.name, outputs=outputs)
"""
TEXT = "hello world 😁"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("examples")
    write_custom_model(root / "echo", ECHO, "EchoRuntime")
    declared = {"name": "metadata-str", "datatype": "BYTES", "shape": [11]}
    declared["parameters"] = {"content_type": "str"}
    write_custom_model(root / "declared", ECHO, "EchoRuntime", inputs=[declared])
    return root


@pytest.fixture(scope="module", params=["0", "1"], ids=["in-process", "workers"])
def server(request: pytest.FixtureRequest, repository: Path) -> Iterator[Server]:
    with Server(repository, "--workers", request.param) as running:
        running.wait_ready()
        yield running


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[GRPCInferenceServiceStub]:
    with stub_for(server) as opened:
        yield opened


def seen(answer: dict, output: int = 0) -> dict:
    """What the echo model saw of one input: its ``dict()`` and its decoded strings."""
    return json.loads(answer["outputs"][output]["data"][0])


def rest(server: Server, model: str, inputs: list[dict]) -> httpx.Response:
    url = f"{server.url}/v2/models/{model}/infer"
    return httpx.post(url, json={"inputs": inputs}, timeout=30)


# -- loose string tensors, and strings as str ---------------------------------------------


@pytest.mark.parametrize(
    ("tensor", "joined"),
    [
        # custom-json's REST request: one string, its length as shape
        ({"shape": [len(TEXT)], "data": [TEXT]}, TEXT),
        # content-type's: a bare string as data
        ({"shape": [1], "data": TEXT, "parameters": {"content_type": "str"}}, TEXT),
        # two strings with a shape of [2, 11]
        ({"shape": [2, 11], "data": ["hello", "world"]}, "helloworld"),
    ],
    ids=["length-as-shape", "bare-string", "two-strings"],
)
def test_loose_string_tensors_are_taken_as_mlserver_takes_them(server, tensor, joined):
    response = rest(server, "echo", [{"name": "s", "datatype": "BYTES", **tensor}])
    assert response.status_code == 200, response.text
    assert seen(response.json())["joined"] == joined
    # The model's answer (one string, its length as shape) comes back as its one string.
    (output,) = response.json()["outputs"]
    assert output["datatype"] == "BYTES" and len(output["data"]) == 1


def test_loose_string_tensors_over_grpc(server, stub):
    request = pb.ModelInferRequest(model_name="echo")
    one = request.inputs.add(name="one", datatype="BYTES", shape=[len(TEXT.encode())])
    one.contents.bytes_contents.append(TEXT.encode())
    two = request.inputs.add(name="two", datatype="BYTES", shape=[2, 11])
    two.contents.bytes_contents.extend([b"hello", b"world"])
    response = stub.ModelInfer(request, timeout=30)
    joined = [json.loads(o.contents.bytes_contents[0])["joined"] for o in response.outputs]
    assert joined == [TEXT, "helloworld"]


def test_numeric_tensors_keep_their_shape_checks(server, stub):
    response = rest(server, "echo", [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1]}])
    assert response.status_code == 400
    assert response.json() == {"error": "input 'x': shape [3] needs 3 values, got 1"}
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="FP32", shape=[3]).contents.fp32_contents.append(1.0)
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(request, timeout=30)
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("content_type", ["str", "json"])
def test_text_content_types_reach_the_model_as_str(server, stub, content_type):
    # The content-type example's first request: json.dumps of the input needs str data.
    tensor = {"name": "s", "datatype": "BYTES", "shape": [1], "data": [TEXT]}
    tensor["parameters"] = {"content_type": content_type}
    response = rest(server, "echo", [tensor])
    assert response.status_code == 200, response.text
    assert seen(response.json())["dict"]["data"] == [TEXT]
    # Over gRPC too (MLServer's StringCodec gives str either way).
    request = pb.ModelInferRequest(model_name="echo")
    sent = request.inputs.add(name="s", datatype="BYTES", shape=[1])
    sent.parameters["content_type"].string_param = content_type
    sent.contents.bytes_contents.append(TEXT.encode())
    output = stub.ModelInfer(request, timeout=30).outputs[0]
    assert json.loads(output.contents.bytes_contents[0])["dict"]["data"] == [TEXT]


def test_a_content_type_the_metadata_declares_makes_str_too(server):
    # The content-type example's second request: no parameters, the metadata's "str".
    tensor = {"name": "metadata-str", "datatype": "BYTES", "shape": [11], "data": TEXT}
    response = rest(server, "declared", [tensor])
    assert response.status_code == 200, response.text
    assert seen(response.json())["dict"]["data"] == [TEXT]


def test_grpc_strings_without_a_text_content_type_stay_bytes(server, stub):
    # As MLServer's gRPC gives them (and a text content type with no UTF-8 either).
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="b", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
        b"plain"
    )
    sent = request.inputs.add(name="s", datatype="BYTES", shape=[1])
    sent.parameters["content_type"].string_param = "str"
    sent.contents.bytes_contents.append(b"\xff\x00")
    outputs = stub.ModelInfer(request, timeout=30).outputs
    data = [json.loads(o.contents.bytes_contents[0])["dict"]["data"] for o in outputs]
    assert data == [[{"bytes": "plain"}], [{"bytes": "\xff\x00"}]]


# -- the repository API's bodies and the CloudEvents headers -----------------------------


def test_load_and_unload_answer_an_empty_body_and_the_index_an_empty_reason(server):
    for action in ("unload", "load"):
        response = httpx.post(f"{server.url}/v2/repository/models/echo/{action}", timeout=120)
        assert response.status_code == 200, response.text
        assert response.content == b""
        assert "content-type" not in response.headers
        if action == "unload":
            index = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
            assert {"name": "echo", "state": "UNAVAILABLE", "reason": ""} in index


def test_rest_answers_carry_mlserver_cloudevents_headers(server):
    tensor = {"name": "s", "datatype": "BYTES", "shape": [1], "data": ["x"]}
    url = f"{server.url}/v2/models/declared/infer"
    response = httpx.post(url, json={"id": "my-id", "inputs": [tensor]}, timeout=30)
    assert response.status_code == 200, response.text
    ce = {name: value for name, value in response.headers.items() if name.startswith("ce-")}
    assert ce == {
        "ce-specversion": "0.3",
        "ce-source": "io.seldon.serving.deployment.mlserver",
        "ce-type": "io.seldon.serving.inference.response",
        "ce-modelid": "declared",
        "ce-inferenceservicename": "mlserver",
        "ce-endpoint": "declared",
        "ce-id": "my-id",
        "ce-requestid": "my-id",
    }
    # Each answer its own id; errors carry none.
    other = httpx.post(url, json={"id": "other", "inputs": [tensor]}, timeout=30)
    assert (other.headers["ce-id"], other.headers["ce-modelid"]) == ("other", "declared")
    missing = httpx.post(f"{server.url}/v2/models/nothing/infer", json={"inputs": [tensor]})
    assert missing.status_code == 404
    assert not [name for name in missing.headers if name.startswith("ce-")]


def test_cloudevents_headers_can_be_switched_off(tmp_path):
    X, y = iris_data()
    write_sklearn_model(tmp_path / "iris", LogisticRegression(max_iter=500).fit(X, y))
    body = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 4], "data": X[0].tolist()}]}
    with Server(tmp_path, "--workers", "0", "--no-cloudevents") as server:
        server.wait_ready()
        response = httpx.post(f"{server.url}/v2/models/iris/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert not [name for name in response.headers if name.startswith("ce-")]


# -- folders that are not models ----------------------------------------------------------


def test_folders_beside_a_root_model_are_its_files(tmp_path):
    # CatBoost's and MLflow's examples: `mlserver start .` in a folder holding the
    # model-settings.json, with training's folders beside it.
    X, y = iris_data()
    estimator = LogisticRegression(max_iter=500).fit(X, y)
    write_sklearn_model(tmp_path / "artefacts", estimator)
    settings = {
        "name": "wine-classifier",
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": "./artefacts/model.joblib"},
    }
    (tmp_path / "model-settings.json").write_text(json.dumps(settings))
    (tmp_path / "catboost_info").mkdir()
    (tmp_path / "catboost_info" / "learn_error.tsv").write_text("iter\tLogloss\n0\t0.6\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('training')\n")
    run = tmp_path / "mlruns" / "0" / "6cd26d62" / "artifacts" / "model"
    run.mkdir(parents=True)
    (run / "MLmodel").write_text("flavors: {}\n")
    body = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 4], "data": X[0].tolist()}]}
    with Server(tmp_path, "--workers", "0") as server:
        server.wait_ready()
        index = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
        assert [entry["name"] for entry in index] == ["wine-classifier"]
        response = httpx.post(f"{server.url}/v2/models/wine-classifier/infer", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == estimator.predict(X[:1]).tolist()


def test_folders_without_settings_or_artefact_are_skipped_once_settings_exist(tmp_path):
    X, y = iris_data()
    estimator = LogisticRegression(max_iter=500).fit(X, y)
    mlserver = write_sklearn_model(tmp_path / "with-settings", estimator)
    (mlserver / "model-settings.json").write_text(json.dumps({"name": "iris"}))
    write_sklearn_model(tmp_path / "bare", estimator)  # an artefact: still a model
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("not a model\n")
    with Server(tmp_path, "--workers", "0") as server:
        server.wait_ready()
        index = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
        assert sorted(entry["name"] for entry in index) == ["bare", "iris"]
        server.expect_lines([r"notes: no model-settings\.json and no model artefact"])


def test_without_any_settings_every_folder_is_still_a_model(tmp_path):
    X, y = iris_data()
    write_sklearn_model(tmp_path / "iris", LogisticRegression(max_iter=500).fit(X, y))
    (tmp_path / "notes").mkdir()
    # No model-settings.json anywhere: each folder's artefact names its runtime, and a
    # folder without one fails as before (the start-up refuses it).
    with Server(tmp_path, "--workers", "0") as server:
        assert server.wait_exit(60) != 0
        assert "no model artefact in" in server.output()
