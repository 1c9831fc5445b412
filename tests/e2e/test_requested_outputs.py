"""Only the outputs a request names are answered, whatever the runtime computed, with
--workers 0 and 2, over REST JSON, REST's binary extension (tritonclient) and gRPC
(typed and raw contents): a custom ``Runtime`` and an MLServer ``MLModel`` that both
answer three values to any request, an MLflow model served by MLServer's runtime (it
answers its whole result), a pipeline over the custom runtime, and scikit-learn. A request
naming no output gets everything the runtime answers; naming one the model lacks is 400 /
INVALID_ARGUMENT listing the ones it has.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, build_iris_repository, write_custom_model
from tests.support.grpc import WORKER_COUNTS, stub_for
from tests.support.pipelines import write_pipeline

pytestmark = pytest.mark.timeout(180)

# Answers three outputs whatever the request names (the example).
COUNTER = """
import os

import numpy as np

from inferpool import Runtime


class Counter(Runtime):
    def load(self):
        self.calls = 0

    def predict(self, payload, outputs):
        self.calls += 1
        x = np.asarray(payload, dtype=np.float64)
        return {
            "s": x.sum(axis=1),
            "calls": np.array([self.calls], dtype=np.int64),
            "pid": np.array([os.getpid()], dtype=np.int64),
        }
"""
MLMODEL_COUNTER = """
import os

import numpy as np

from inferpool.mlserver import MLModel
from inferpool.mlserver.codecs import NumpyCodec
from inferpool.mlserver.types import InferenceRequest, InferenceResponse


class Counter(MLModel):
    async def load(self) -> bool:
        self.calls = 0
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        self.calls += 1
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float64)
        outputs = [
            NumpyCodec.encode_output("s", x.sum(axis=1)),
            NumpyCodec.encode_output("calls", np.array([self.calls], dtype=np.int64)),
            NumpyCodec.encode_output("pid", np.array([os.getpid()], dtype=np.int64)),
        ]
        return InferenceResponse(model_name=self.name, outputs=outputs)
"""
# Without a signature: MLServer's MLflow runtime answers each column of the frame.
FRAME_MODEL = """
import mlflow
import numpy as np
import pandas as pd


class Frame(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        x = np.asarray(model_input, dtype=np.float64)
        return pd.DataFrame({"total": x.sum(axis=1), "peak": x.max(axis=1)})


mlflow.models.set_model(Frame())
"""
THREE = [
    {"name": "s", "datatype": "FP64", "shape": [-1]},
    {"name": "calls", "datatype": "INT64", "shape": [1]},
    {"name": "pid", "datatype": "INT64", "shape": [1]},
]
X = np.array([[1.0, 2.0], [3.0, 4.0]])
IRIS = np.array([[5.1, 3.5, 1.4, 0.2]])
# (model, its input, the outputs requested, the outputs answered)
CASES = [
    ("counter", X, ["s"], ["s"]),
    ("counter", X, ["pid", "s"], ["pid", "s"]),
    ("counter", X, [], ["s", "calls", "pid"]),
    ("counter-mlmodel", X, ["s"], ["s"]),
    ("counter-mlmodel", X, ["calls", "s"], ["calls", "s"]),
    ("counter-mlmodel", X, [], ["s", "calls", "pid"]),
    ("counted", X, ["s"], ["s"]),
    ("frame", X, ["peak"], ["peak"]),
    ("iris-logreg", IRIS, ["predict_proba"], ["predict_proba"]),
]
IDS = [f"{model}-{'+'.join(asked) or 'all'}" for model, _, asked, _ in CASES]


def build_repository(root: Path) -> Path:
    import mlflow.pyfunc

    build_iris_repository(root)
    spec = [{"name": "x", "datatype": "FP64", "shape": [-1, 2]}]
    write_custom_model(root / "counter", COUNTER, "Counter", inputs=spec, outputs=THREE)
    write_custom_model(root / "counter-mlmodel", MLMODEL_COUNTER, "Counter")
    write_pipeline(
        root, "counted", {"steps": [{"model": "counter", "outputs": ["s", "calls", "pid"]}]}
    )
    source = root.parent / "frame_code.py"
    source.write_text(textwrap.dedent(FRAME_MODEL))
    mlflow.pyfunc.save_model(str(root / "frame"), python_model=str(source), pip_requirements=[])
    settings = {"name": "frame", "implementation": "mlserver_mlflow.MLflowRuntime"}
    (root / "frame" / "model-settings.json").write_text(json.dumps(settings))
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("outputs") / "models")


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda w: f"w{w}")
def server(request: pytest.FixtureRequest, repository: Path) -> Iterator[Server]:
    with Server(repository, "--workers", str(request.param)) as running:
        running.wait_ready(120)
        yield running


def rest_body(rows: np.ndarray, asked: list[str]) -> dict:
    tensor = {"name": "x", "datatype": "FP64", "shape": list(rows.shape)}
    body: dict = {"inputs": [{**tensor, "data": rows.ravel().tolist()}]}
    if asked:
        body["outputs"] = [{"name": name} for name in asked]
    return body


@pytest.mark.parametrize(("model", "rows", "asked", "answered"), CASES, ids=IDS)
def test_rest_answers_only_the_requested_outputs(server, model, rows, asked, answered) -> None:
    url = f"{server.url}/v2/models/{model}/infer"
    reply = httpx.post(url, json=rest_body(rows, asked), timeout=30)
    assert reply.status_code == 200, reply.text
    assert [output["name"] for output in reply.json()["outputs"]] == answered


@pytest.mark.parametrize(("model", "rows", "asked", "answered"), CASES, ids=IDS)
def test_grpc_answers_only_the_requested_outputs(server, model, rows, asked, answered) -> None:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP64", shape=rows.shape)
    # Raw contents in, raw contents out: one raw_output_contents entry per output answered.
    request.raw_input_contents.append(rows.astype("<f8").tobytes())
    for name in asked:
        request.outputs.add(name=name)
    with stub_for(server) as stub:
        response = stub.ModelInfer(request, timeout=30)
    assert [output.name for output in response.outputs] == answered
    assert len(response.raw_output_contents) == len(answered)


@pytest.mark.parametrize(("model", "rows", "asked", "answered"), CASES, ids=IDS)
def test_binary_extension_answers_only_the_requested_outputs(
    server, model, rows, asked, answered
) -> None:
    client = triton.InferenceServerClient(server.url[len("http://") :])
    tensor = triton.InferInput("x", list(rows.shape), "FP64")
    tensor.set_data_from_numpy(rows, binary_data=True)
    requested = [triton.InferRequestedOutput(name, binary_data=True) for name in asked]
    result = client.infer(model, [tensor], outputs=requested or None)
    outputs = result.get_response()["outputs"]
    assert [output["name"] for output in outputs] == answered
    for output in outputs:
        assert output["parameters"]["binary_data_size"] > 0


@pytest.mark.parametrize("model", ["counter", "iris-logreg"])
def test_an_output_the_model_lacks_is_a_400_naming_those_it_has(server, model) -> None:
    rows = X if model == "counter" else IRIS
    available = (
        "s, calls, pid" if model == "counter" else "predict, predict_proba, decision_function"
    )
    message = f"model '{model}' has no output 'nope'; available: {available}"
    reply = httpx.post(
        f"{server.url}/v2/models/{model}/infer", json=rest_body(rows, ["nope"]), timeout=30
    )
    assert (reply.status_code, reply.json()) == (400, {"error": message})
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP64", shape=rows.shape)
    request.inputs[0].contents.fp64_contents.extend(rows.ravel().tolist())
    request.outputs.add(name="nope")
    with stub_for(server) as stub, pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=30)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == message
