"""The repository index and model readiness as Triton's, on both protocols.

A version unloaded through the API stays listed (UNAVAILABLE, with MLServer's empty reason;
its metadata's reason says "unloaded"): model
ready answers false (REST 503, gRPC ``ready: false``, tritonclient's ``is_model_ready``
False, never NOT_FOUND), metadata carries its state, inference is 404 / NOT_FOUND saying
it was unloaded (as MLServer and KServe: a 503 would be retried for ever), statistics
leave it out, and the server stays ready. Loading it
again makes it READY. A version the repository no longer holds is dropped. The REST
index honours ``{"ready": true}`` as gRPC's ``RepositoryIndex`` does. The table is the
engine client's, the same in-process and with workers: the pool's run is ``slow`` (the CI
budget).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, build_iris_repository, iris_data
from tests.support.grpc import infer_request, needs_pool, stub_for

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}

WORKERS = [0, pytest.param(2, marks=(needs_pool, pytest.mark.slow))]
UNLOADED_ERROR = "model 'iris-rf' was unloaded (load it again to serve it)"


@pytest.fixture(scope="module", params=WORKERS, ids=lambda w: f"w{w}")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    repository = build_iris_repository(tmp_path_factory.mktemp("index"))
    with Server(repository, "--workers", str(request.param)) as server:
        server.wait_ready(120)
        server.repository = repository
        yield server


@pytest.fixture()
def stub(server: Server) -> Iterator:
    with stub_for(server) as stub:
        yield stub


def index(server: Server, **body: object) -> list[dict]:
    response = httpx.post(f"{server.url}/v2/repository/index", json=body or None, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def call(server: Server, action: str, name: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/repository/models/{name}/{action}", timeout=120)


def test_an_unloaded_model_stays_listed_and_answers_not_ready(server: Server, stub) -> None:
    url = server.url
    assert call(server, "unload", "iris-rf").status_code == 200
    try:
        # Listed UNAVAILABLE with MLServer's empty reason, on both protocols.
        entry = {"name": "iris-rf", "state": "UNAVAILABLE", "reason": ""}
        assert entry in index(server)
        grpc_index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30)
        listed = {m.name: (m.state, m.reason) for m in grpc_index.models}
        assert listed["iris-rf"] == ("UNAVAILABLE", "")
        # Model ready: false on both protocols, never NOT_FOUND.
        ready = httpx.get(f"{url}/v2/models/iris-rf/ready", timeout=10)
        assert ready.status_code == 503
        assert ready.json() == {
            "name": "iris-rf",
            "ready": False,
            "error": "model 'iris-rf' is UNAVAILABLE: unloaded",
        }
        assert stub.ModelReady(pb.ModelReadyRequest(name="iris-rf"), timeout=10).ready is False
        assert not triton_http.InferenceServerClient(url[len("http://") :]).is_model_ready(
            "iris-rf"
        )
        assert not triton_grpc.InferenceServerClient(server.grpc_address).is_model_ready("iris-rf")
        # Metadata says its state; inference is 404 / NOT_FOUND saying it was unloaded,
        # with no Retry-After: nothing will serve it until it is loaded again.
        metadata = httpx.get(f"{url}/v2/models/iris-rf", timeout=10).json()
        assert (metadata["state"], metadata["reason"]) == ("UNAVAILABLE", "unloaded")
        infer = httpx.post(f"{url}/v2/models/iris-rf/infer", json=BODY, timeout=30)
        assert infer.status_code == 404
        assert infer.json() == {"error": UNLOADED_ERROR}
        assert "retry-after" not in infer.headers
        x, _ = iris_data()
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(infer_request("iris-rf", x=x[:1]), timeout=30)
        assert error.value.code() is grpc.StatusCode.NOT_FOUND
        assert error.value.details() == UNLOADED_ERROR
        metadata = dict(error.value.trailing_metadata() or ())
        assert "grpc-retry-pushback-ms" not in metadata
        # Statistics: only loaded models have them (as Triton).
        stats = httpx.get(f"{url}/v2/models/stats", timeout=10).json()["model_stats"]
        assert [s["name"] for s in stats] == ["iris-logreg"]
        named = httpx.get(f"{url}/v2/models/iris-rf/stats", timeout=10)
        assert named.status_code == 503 and "unloaded" in named.json()["error"]
        # It no longer counts for readiness; unloading it again is fine.
        assert httpx.get(f"{url}/v2/health/ready", timeout=10).status_code == 200
        assert call(server, "unload", "iris-rf").status_code == 200
    finally:
        loaded = call(server, "load", "iris-rf")
    assert loaded.status_code == 200, loaded.text
    assert {"name": "iris-rf", "state": "READY", "reason": ""} in index(server)
    assert httpx.get(f"{url}/v2/models/iris-rf/ready", timeout=10).status_code == 200
    assert triton_grpc.InferenceServerClient(server.grpc_address).is_model_ready("iris-rf")
    assert httpx.post(f"{url}/v2/models/iris-rf/infer", json=BODY, timeout=30).status_code == 200


def test_the_ready_filter_on_rest_and_grpc(server: Server, stub) -> None:
    assert call(server, "unload", "iris-logreg").status_code == 200
    try:
        everything = {entry["name"]: entry["state"] for entry in index(server)}
        assert everything == {"iris-logreg": "UNAVAILABLE", "iris-rf": "READY"}
        assert index(server, ready=False) == index(server)
        assert [entry["name"] for entry in index(server, ready=True)] == ["iris-rf"]
        ready = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True), timeout=30)
        assert [m.name for m in ready.models] == ["iris-rf"]
        every = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30)
        assert sorted(m.name for m in every.models) == ["iris-logreg", "iris-rf"]
    finally:
        assert call(server, "load", "iris-logreg").status_code == 200


def test_a_model_the_repository_no_longer_holds_is_dropped(server: Server) -> None:
    repository: Path = server.repository
    gone = repository / "gone"
    shutil.copytree(repository / "iris-logreg", gone)
    assert call(server, "load", "gone").status_code == 200
    # Unloaded, then its folder removed: the next unload or load drops it (404).
    assert call(server, "unload", "gone").status_code == 200
    assert {"name": "gone", "state": "UNAVAILABLE", "reason": ""} in index(server)
    assert httpx.get(f"{server.url}/v2/models/gone", timeout=10).json()["reason"] == "unloaded"
    shutil.rmtree(gone)
    response = call(server, "unload", "gone")
    assert response.status_code == 404, response.text
    assert "gone" not in [entry["name"] for entry in index(server)]
    # Loaded, then its folder removed: unloaded and dropped at once by the next unload.
    shutil.copytree(repository / "iris-logreg", gone)
    assert call(server, "load", "gone").status_code == 200
    shutil.rmtree(gone)
    assert call(server, "unload", "gone").status_code == 200
    assert "gone" not in [entry["name"] for entry in index(server)]
    # Unloaded, removed, then a load: 404, and dropped.
    shutil.copytree(repository / "iris-logreg", gone)
    assert call(server, "load", "gone").status_code == 200
    assert call(server, "unload", "gone").status_code == 200
    shutil.rmtree(gone)
    assert call(server, "load", "gone").status_code == 404
    assert "gone" not in [entry["name"] for entry in index(server)]
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
