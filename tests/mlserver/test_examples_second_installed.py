"""MLServer 1.7.1's mms, model-repository, streaming, mlflow and custom examples run unchanged
(issue 38, point 10): the second repository of ``tests/mlserver/examples_second.py``
served by inferpool and by ``mlserver start`` side by side, each README's calls sent to
both, the answers compared.

- mms: each model's request (REST and gRPC): status, outputs, model version.
- model-repository: the README's index, unload, index, load, index (REST): the status,
  the body of each call and the index's entries.
- streaming: REST ``generate_stream`` (one Server-Sent Event per word) and gRPC
  ``ModelStreamInfer`` with MLServer's own client (its converter's typed contents, its
  stub reading bare ``ModelInferResponse`` messages), as the README sends them.
- mlflow (when ``mlserver-mlflow`` and the full ``mlflow`` package are installed, as tox's
  ``mlserver`` environment does): the README's V2 request (REST and gRPC), MLflow's
  ``/invocations`` with ``dataframe_split``, and the model's metadata.
- custom (when numpyro and jax are installed, as tox's ``mlserver`` environment does): the
  README's request (REST and gRPC).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

# MLServer's streaming example's generate-request.json (shared with the e2e test).
from tests.e2e.test_stream_event_headers import REQUEST as GENERATE_REQUEST
from tests.mlserver.examples_second import (
    WINE,
    WINE_COLUMNS,
    mlflow_installed,
    numpyro_installed,
    write_second,
)
from tests.mlserver.side_by_side import (
    assert_rest_same,
    grpc_infer,
    side_by_side,
)
from tests.support import Server
from tests.support.same_outputs import assert_same_outputs

WITH_MLFLOW, WITH_NUMPYRO = mlflow_installed(), numpyro_installed()
needs_mlflow = pytest.mark.skipif(
    not WITH_MLFLOW, reason="mlserver-mlflow and the full mlflow package are not installed"
)


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("mlserver-examples-second")
    return root, write_second(root, WITH_MLFLOW, WITH_NUMPYRO)


@pytest.fixture(scope="module")
def both(second) -> Iterator[tuple[Server, tuple[str, str]]]:
    """inferpool and MLServer (its REST URL and gRPC address) on the second repository."""
    with side_by_side(second[0]) as pair:
        yield pair


needs_numpyro = pytest.mark.skipif(not WITH_NUMPYRO, reason="numpyro and jax are not installed")
CASES = [
    "mms-sklearn",
    "mms-xgboost",
    pytest.param("mlflow", marks=needs_mlflow),
    pytest.param("custom", marks=needs_numpyro),
]


@pytest.mark.parametrize("name", CASES)
def test_rest_answers_as_mlserver(name: str, second, both) -> None:
    path, body = second[1][name]
    assert_rest_same(both[0].url, both[1][0], path, body)


@pytest.mark.parametrize("name", CASES)
def test_grpc_answers_as_mlserver(name: str, second, both) -> None:
    path, body = second[1][name]
    flat = [{**tensor, "data": np.ravel(tensor["data"]).tolist()} for tensor in body["inputs"]]
    body = {**body, "inputs": flat}  # typed contents are flat; the README's rows are nested
    ours, theirs = both[0].grpc_address, both[1][1]
    assert_same_outputs(grpc_infer(ours, path, body), grpc_infer(theirs, path, body), atol=1e-7)


def _repository_walk(url: str) -> list[tuple[int, bytes, list | None]]:
    """The model-repository README's calls: (status, body, the index's sorted entries)."""
    calls = [
        ("/v2/repository/index", {}),
        ("/v2/repository/models/mushroom-xgboost/unload", None),
        ("/v2/repository/index", {}),
        ("/v2/repository/models/mushroom-xgboost/load", None),
        ("/v2/repository/index", {}),
    ]
    answers = []
    for path, body in calls:
        answer = httpx.post(url + path, json=body, timeout=120)
        index = sorted(answer.json(), key=lambda e: e["name"]) if "index" in path else None
        answers.append((answer.status_code, b"" if index else answer.content, index))
    return answers


def test_the_repository_api_answers_as_mlserver(both, second) -> None:
    ours, theirs = _repository_walk(both[0].url), _repository_walk(both[1][0])
    assert ours == theirs
    unloaded = {e["name"]: e["state"] for e in ours[2][2]}
    assert unloaded["mushroom-xgboost"] == "UNAVAILABLE" and unloaded["mnist-svm"] == "READY"
    path, body = second[1]["mms-xgboost"]  # served again once loaded
    assert httpx.post(both[0].url + path, json=body, timeout=60).status_code == 200


def _sse_events(url: str) -> list[dict]:
    """``generate_stream`` as the streaming README calls it: each event's V2 response."""
    events = []
    path = "/v2/models/text-model/generate_stream"
    with httpx.stream("POST", url + path, json=GENERATE_REQUEST, timeout=60) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[len("data:") :]))
    return events


WORDS = ["What", " is", " the", " capital", " of", " France?"]


def test_generate_stream_answers_as_mlserver(both) -> None:
    ours, theirs = _sse_events(both[0].url), _sse_events(both[1][0])
    assert [e["outputs"][0]["data"] for e in ours] == [e["outputs"][0]["data"] for e in theirs]
    assert [e["outputs"][0]["data"] for e in ours] == [[word] for word in WORDS]
    for one, other in zip(ours, theirs, strict=True):
        assert_same_outputs(one["outputs"], other["outputs"], atol=1e-7)
        assert one["model_name"] == other["model_name"] == "text-model"
        assert sorted(one["parameters"]["headers"]) == sorted(other["parameters"]["headers"])


def test_streaming_metadata_answers_as_mlserver(both) -> None:
    """The example's model-settings.json gives ``versions`` and ``platform``: the
    MLModel's metadata() answers them in both servers."""
    path = "/v2/models/text-model"
    ours = httpx.get(both[0].url + path, timeout=60).json()
    theirs = httpx.get(both[1][0] + path, timeout=60).json()
    for key in ("name", "versions", "platform", "inputs", "outputs"):
        assert ours[key] == theirs[key], key
    assert (ours["versions"], ours["platform"]) == (["text-model/v1.2.3"], "mlserver")


def _mlserver_client_stream(address: str) -> list[list[str]]:
    """The README's gRPC call: MLServer's converter and stub, its responses converted back
    to MLServer's types and decoded with StringCodec."""
    import mlserver.grpc.dataplane_pb2_grpc as dataplane
    from mlserver import types
    from mlserver.codecs import StringCodec
    from mlserver.grpc.converters import ModelInferRequestConverter, ModelInferResponseConverter

    request = types.InferenceRequest.model_validate(GENERATE_REQUEST)
    request.inputs[0] = StringCodec.encode_input("prompt", request.inputs[0].data.root)
    message = ModelInferRequestConverter.from_types(
        request, model_name="text-model", model_version=None
    )
    with grpc.insecure_channel(address) as channel:
        stub = dataplane.GRPCInferenceServiceStub(channel)
        responses = list(stub.ModelStreamInfer(iter([message]), timeout=60))
    with warnings.catch_warnings():  # its converter calls pydantic's deprecated construct()
        warnings.simplefilter("ignore", DeprecationWarning)
        decoded = [ModelInferResponseConverter.to_types(response) for response in responses]
    return [StringCodec.decode_output(response.outputs[0]) for response in decoded]


def test_model_stream_infer_answers_mlservers_client_as_mlserver(both) -> None:
    ours, theirs = (
        _mlserver_client_stream(both[0].grpc_address),
        _mlserver_client_stream(both[1][1]),
    )
    assert ours == theirs == [[word] for word in WORDS]


@needs_mlflow
def test_mlflow_invocations_answer_as_mlserver(both) -> None:
    body = {"dataframe_split": {"columns": WINE_COLUMNS, "data": [WINE]}}
    ours = httpx.post(both[0].url + "/invocations", json=body, timeout=60)
    theirs = httpx.post(both[1][0] + "/invocations", json=body, timeout=60)
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    assert ours.json().keys() == theirs.json().keys()
    assert ours.json()["predictions"] == pytest.approx(theirs.json()["predictions"])


@needs_mlflow
def test_mlflow_metadata_answers_as_mlserver(both) -> None:
    path = "/v2/models/wine-classifier"
    ours = httpx.get(both[0].url + path, timeout=60).json()
    theirs = httpx.get(both[1][0] + path, timeout=60).json()
    for key in ("name", "versions", "inputs", "outputs", "parameters"):
        assert ours.get(key) == theirs.get(key), key
    # The one difference (the migration guide's mlflow row): inferpool's metadata names
    # the runtime's platform; MLServer echoes model-settings.json's, empty here.
    assert (ours["platform"], theirs["platform"]) == ("mlflow", "")
