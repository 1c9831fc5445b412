"""One data plane, two protocols: REST and gRPC give the same V2 answers for the same
repository, and REST honours the repository index's ``ready`` filter as gRPC does."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, build_iris_repository
from tests.support.grpc import stub_for


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """iris-logreg and iris-rf READY, ``broken`` FAILED (kept serving: --no-exit-on-error)."""
    repository = build_iris_repository(tmp_path_factory.mktemp("repo"))
    broken = repository / "broken"
    broken.mkdir()
    (broken / "model.joblib").write_bytes(b"not a model")
    with Server(repository, "--workers", "0", "--no-exit-on-error") as running:
        running.wait_live()
        wait_for_states(running, {"iris-logreg": "READY", "iris-rf": "READY", "broken": "FAILED"})
        yield running


def wait_for_states(server: Server, expected: dict[str, str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        states = {entry["name"]: entry["state"] for entry in index}
        if states == expected:
            return
        time.sleep(0.1)
    raise TimeoutError(f"models are {states}, not {expected}:\n{server.output()}")


def rest_index(server: Server, **kwargs) -> list[dict]:
    response = httpx.post(f"{server.url}/v2/repository/index", **kwargs)
    assert response.status_code == 200, response.text
    return sorted(response.json(), key=lambda entry: entry["name"])


def test_the_rest_index_lists_a_failed_model_unless_only_ready_ones_are_asked_for(server):
    everything = rest_index(server)
    assert [entry["name"] for entry in everything] == ["broken", "iris-logreg", "iris-rf"]
    failed = everything[0]
    assert failed["state"] == "FAILED" and failed["reason"]
    # Every form of "every model": no body (tritonclient), {}, ready false, a GET.
    assert rest_index(server, content=b"") == everything
    assert rest_index(server, json={}) == everything
    assert rest_index(server, json={"ready": False}) == everything
    assert sorted(httpx.get(f"{server.url}/v2/repository/index").json(), key=str) == sorted(
        everything, key=str
    )
    ready = rest_index(server, json={"ready": True})
    assert [entry["name"] for entry in ready] == ["iris-logreg", "iris-rf"]
    assert all(entry["state"] == "READY" for entry in ready)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "not valid JSON"),
        (b"[true]", "must be a JSON object"),
        (b'{"ready": "yes"}', "'ready'"),
        # Parsed with the inference bodies' own checks: the depth limit holds here too.
        (b'{"ready": true, "x": ' + b"[" * 200 + b"]" * 200 + b"}", "max_json_depth"),
    ],
)
def test_a_malformed_rest_index_request_is_a_bad_request(server, body, message):
    response = httpx.post(f"{server.url}/v2/repository/index", content=body)
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert httpx.post(f"{server.url}/v2/repository/index").status_code == 200


def test_tritonclients_repository_index_gets_every_model(server):
    triton = pytest.importorskip("tritonclient.http")
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        names = {entry["name"] for entry in client.get_model_repository_index()}
    finally:
        client.close()
    assert names == {"broken", "iris-logreg", "iris-rf"}


def grpc_index(stub, ready: bool) -> list[dict]:
    models = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=ready)).models
    entries = []
    for model in models:
        entry = {"name": model.name, "state": model.state, "reason": model.reason}
        if model.version:
            entry["version"] = model.version
        entries.append(entry)
    return sorted(entries, key=lambda entry: entry["name"])


def grpc_metadata(stub, name: str) -> dict:
    response = stub.ModelMetadata(pb.ModelMetadataRequest(name=name))
    tensors = {
        kind: [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
            for t in getattr(response, kind)
        ]
        for kind in ("inputs", "outputs")
    }
    return {
        "name": response.name,
        "versions": list(response.versions),
        "platform": response.platform,
        **tensors,
    }


def test_rest_and_grpc_give_the_same_answers_for_the_same_repository(server):
    with stub_for(server) as stub:
        for ready in (False, True):
            assert grpc_index(stub, ready) == rest_index(server, json={"ready": ready})
        rest_server = httpx.get(f"{server.url}/v2").json()
        grpc_server = stub.ServerMetadata(pb.ServerMetadataRequest())
        assert rest_server == {
            "name": grpc_server.name,
            "version": grpc_server.version,
            "extensions": list(grpc_server.extensions),
        }
        for name in ("iris-logreg", "iris-rf", "broken"):
            document = httpx.get(f"{server.url}/v2/models/{name}").json()
            fields = ("name", "versions", "platform", "inputs", "outputs")
            shared = {field: document[field] for field in fields}
            for spec in shared["inputs"] + shared["outputs"]:
                spec.pop("parameters", None)
            assert shared == grpc_metadata(stub, name), name
            rest_ready = httpx.get(f"{server.url}/v2/models/{name}/ready")
            grpc_ready = stub.ModelReady(pb.ModelReadyRequest(name=name)).ready
            assert rest_ready.json()["ready"] is grpc_ready is (rest_ready.status_code == 200)
        assert grpc_metadata(stub, "iris-rf")["inputs"], "a loaded model declares its inputs"
