"""Multi-model serving as KServe's and ModelMesh's machinery drives it, against a real
server, with grpcio and httpx clients:

- MLServer's ``inference.model_repository.ModelRepositoryService`` (index, load, unload,
  NOT_FOUND for a model the repository does not hold);
- ModelMesh's MLServer adapter's sequence: the puller's files at ``<id>/``, the adapter's
  ``_mlserver_models/<id>/`` (a symlink and generated settings, or a native folder's
  settings rewritten), ``RepositoryModelLoad``, inference, ``RepositoryModelUnload``, the
  folders removed;
- KServe's model agent's sequence for a TrainedModel: its files and ``SUCCESS.<sha>`` spec
  in ``<name>/``, ``POST /v2/repository/models/<name>/load`` with ``{}``, inference, the
  folder removed, then ``.../unload``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated import model_repository_pb2 as mr
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from inferpool.protocol.generated.model_repository_pb2_grpc import ModelRepositoryServiceStub
from tests.support import Server, iris_data, write_sklearn_model
from tests.support.grpc import infer_request

TIMEOUT = 60.0
ROWS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5]])


@pytest.fixture(scope="module")
def estimator() -> DecisionTreeClassifier:
    X, y = iris_data()
    return DecisionTreeClassifier(random_state=0).fit(X, y)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    """One server (CI time): the default gRPC server, one worker (a load forks a new
    generation from the template, which has sklearn imported; in-process, each load would
    probe the artefact in a child first). grpc.aio serves the same handlers under the same
    names: tests/e2e/test_api_keys.py calls this service on both servers."""
    root = tmp_path_factory.mktemp("models")
    X, y = iris_data()
    write_sklearn_model(root / "base", LogisticRegression(max_iter=1000).fit(X, y))
    with Server(root, "--workers", "1") as running:
        running.wait_ready()
        running.root = root  # type: ignore[attr-defined]
        yield running


@pytest.fixture
def channel(server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_address) as open_channel:
        yield open_channel


def code_of(call, request) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as raised:
        call(request, timeout=TIMEOUT)
    return raised.value.code()


def predicted(channel: grpc.Channel, model: str) -> list[int]:
    """The model's classes for ROWS, over gRPC ModelInfer."""
    response = GRPCInferenceServiceStub(channel).ModelInfer(
        infer_request(model, input=ROWS), timeout=TIMEOUT
    )
    [output] = response.outputs
    if response.raw_output_contents:
        return np.frombuffer(response.raw_output_contents[0], np.int64).tolist()
    return list(output.contents.int64_contents)


def test_model_repository_service(server, channel) -> None:
    stub = ModelRepositoryServiceStub(channel)
    ready = stub.RepositoryIndex(mr.RepositoryIndexRequest(ready=True), timeout=TIMEOUT)
    entries = {entry.name: entry for entry in ready.models}
    assert entries["base"].state == "READY" and entries["base"].reason == ""
    # A model the repository does not hold: NOT_FOUND, as MLServer answers.
    load = mr.RepositoryModelLoadRequest(model_name="no-such-model")
    assert code_of(stub.RepositoryModelLoad, load) == grpc.StatusCode.NOT_FOUND
    unload = mr.RepositoryModelUnloadRequest(model_name="no-such-model")
    assert code_of(stub.RepositoryModelUnload, unload) == grpc.StatusCode.NOT_FOUND
    # Unload and load again through this service; the V2 service sees the same models.
    v2 = GRPCInferenceServiceStub(channel)
    stub.RepositoryModelUnload(mr.RepositoryModelUnloadRequest(model_name="base"), timeout=TIMEOUT)
    assert not v2.ModelReady(pb.ModelReadyRequest(name="base"), timeout=TIMEOUT).ready
    ready = stub.RepositoryIndex(mr.RepositoryIndexRequest(ready=True), timeout=TIMEOUT)
    assert "base" not in {entry.name for entry in ready.models}
    every = stub.RepositoryIndex(mr.RepositoryIndexRequest(), timeout=TIMEOUT)
    [entry] = [entry for entry in every.models if entry.name == "base"]
    assert entry.state == "UNAVAILABLE"
    stub.RepositoryModelLoad(mr.RepositoryModelLoadRequest(model_name="base"), timeout=TIMEOUT)
    assert v2.ModelReady(pb.ModelReadyRequest(name="base"), timeout=TIMEOUT).ready


def adapt_model_file(root: Path, model_id: str) -> None:
    """The adapter's layout of a single model file (``adaptModelLayout``): a symlink to
    the puller's file and generated settings naming the model id."""
    folder = root / "_mlserver_models" / model_id
    folder.mkdir(parents=True)
    (folder / "model.joblib").symlink_to(root / model_id / "model.joblib")
    settings = {
        "name": model_id,
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": str(folder / "model.joblib")},
    }
    (folder / "model-settings.json").write_text(json.dumps(settings, indent=2))


def adapt_native_folder(root: Path, model_id: str) -> None:
    """The adapter's layout of a folder holding its own model-settings.json
    (``adaptNativeModelLayout``): the settings rewritten (name: the id; uri: absolute),
    every other file symlinked."""
    pulled = root / model_id
    (pulled / "model-settings.json").write_text(
        json.dumps({"name": "iris", "parameters": {"uri": "./model.joblib"}})
    )
    folder = root / "_mlserver_models" / model_id
    folder.mkdir(parents=True)
    (folder / "model.joblib").symlink_to(pulled / "model.joblib")
    settings = {"name": model_id, "parameters": {"uri": str(folder / "model.joblib")}}
    (folder / "model-settings.json").write_text(json.dumps(settings, indent=2))


@pytest.mark.parametrize(
    ("service", "adapt"),
    [
        ("inference.model_repository.ModelRepositoryService", adapt_model_file),
        ("inference.GRPCInferenceService", adapt_native_folder),
    ],
    ids=["model-repository-service", "v2-service"],
)
def test_modelmesh_adapter_sequence(server, channel, estimator, service, adapt) -> None:
    root: Path = server.root
    model_id = f"iris__isvc-{adapt.__name__[6:10]}"
    write_sklearn_model(root / model_id, estimator)  # the puller's copy
    adapt(root, model_id)
    load = channel.unary_unary(
        f"/{service}/RepositoryModelLoad",
        request_serializer=mr.RepositoryModelLoadRequest.SerializeToString,
        response_deserializer=mr.RepositoryModelLoadResponse.FromString,
    )
    unload = channel.unary_unary(
        f"/{service}/RepositoryModelUnload",
        request_serializer=mr.RepositoryModelUnloadRequest.SerializeToString,
        response_deserializer=mr.RepositoryModelUnloadResponse.FromString,
    )
    load(mr.RepositoryModelLoadRequest(model_name=model_id), timeout=TIMEOUT)
    assert predicted(channel, model_id) == estimator.predict(ROWS).tolist()
    index = ModelRepositoryServiceStub(channel).RepositoryIndex(
        mr.RepositoryIndexRequest(ready=True), timeout=TIMEOUT
    )
    assert [entry.state for entry in index.models if entry.name == model_id] == ["READY"]
    unload(mr.RepositoryModelUnloadRequest(model_name=model_id), timeout=TIMEOUT)
    v2 = GRPCInferenceServiceStub(channel)
    assert not v2.ModelReady(pb.ModelReadyRequest(name=model_id), timeout=TIMEOUT).ready
    shutil.rmtree(root / "_mlserver_models" / model_id)
    shutil.rmtree(root / model_id)
    gone = mr.RepositoryModelLoadRequest(model_name=model_id)
    assert code_of(load, gone) == grpc.StatusCode.NOT_FOUND


def agent_download(root: Path, name: str, estimator, spec: dict) -> None:
    """What the agent's downloader leaves: the files, then ``SUCCESS.<sha256>`` holding
    the TrainedModel's ``spec.model`` as JSON."""
    write_sklearn_model(root / name, estimator)
    (root / name / "SUCCESS.5d41402abc4b2a76b9719d911017c592").write_text(json.dumps(spec))


def test_kserve_agent_sequence(server, estimator) -> None:
    root: Path = server.root
    spec = {"storageUri": "gs://models/iris", "framework": "sklearn", "memory": "256Mi"}
    agent_download(root, "iris-tm", estimator, spec)
    # The agent's load: POST with "{}" (and no Authorization: it has none to give).
    load = httpx.post(
        f"{server.url}/v2/repository/models/iris-tm/load",
        content=b"{}",
        headers={"content-type": "application/json"},
        timeout=TIMEOUT,
    )
    assert load.status_code == 200, load.text
    body = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [3, 4], "data": ROWS.tolist()}]}
    infer = httpx.post(f"{server.url}/v2/models/iris-tm/infer", json=body, timeout=TIMEOUT)
    assert infer.status_code == 200, infer.text
    assert infer.json()["outputs"][0]["data"] == estimator.predict(ROWS).tolist()
    # A framework inferpool does not serve: the load fails with that reason.
    agent_download(root, "tf-tm", estimator, {**spec, "framework": "tensorflow"})
    refused = httpx.post(f"{server.url}/v2/repository/models/tf-tm/load", content=b"{}")
    assert refused.status_code == 400
    assert "framework 'tensorflow' is not served by inferpool" in refused.json()["error"]
    # A TrainedModel that failed its load costs only itself: the server stays ready.
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=TIMEOUT).status_code == 200
    # Remove: the agent deletes the folder first, then unloads.
    shutil.rmtree(root / "iris-tm")
    unload = httpx.post(
        f"{server.url}/v2/repository/models/iris-tm/unload", content=b"{}", timeout=TIMEOUT
    )
    assert unload.status_code == 200, unload.text
    assert httpx.get(f"{server.url}/v2/models/iris-tm/ready", timeout=TIMEOUT).status_code == 404
    index = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=TIMEOUT).json()
    assert "iris-tm" not in {entry["name"] for entry in index}
