"""The endpoints docs/migrating-from-mlserver.md says are refused or served differently
from MLServer 1.7.1, on a running server: the OpenAPI pages (``/v2/docs``, a model's
``/docs``) where MLServer serves them, MLServer's second repository service unimplemented
over gRPC, the repository index over GET as well as POST, the server metadata naming
inferpool."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest

from inferpool import __version__
from tests.support import Server, build_iris_repository


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = build_iris_repository(tmp_path_factory.mktemp("guide-endpoints"))
    with Server(repository, "--workers", "0") as running:
        running.wait_ready()
        yield running


@pytest.mark.parametrize(
    ("path", "media"), [("/v2/docs", "text/html"), ("/v2/docs/dataplane.json", "application/json")]
)
def test_the_openapi_pages_are_served_where_mlserver_serves_them(
    server: Server, path: str, media: str
) -> None:
    response = httpx.get(server.url + path, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith(media)
    if media == "application/json":
        assert response.json()["openapi"].startswith("3.0")


@pytest.mark.parametrize("path", ["/docs", "/docs/dataplane.json"])
def test_a_models_openapi_pages_are_served_and_an_unknown_ones_are_404(
    server: Server, path: str
) -> None:
    assert httpx.get(server.url + "/v2/models/iris-logreg" + path, timeout=30).status_code == 200
    for prefix in ("/v2/models/nope", "/v2/models/iris-logreg/versions/1"):
        response = httpx.get(server.url + prefix + path, timeout=30)
        assert response.status_code == 404, (prefix, response.text)
        assert "error" in response.json()


def test_mlservers_model_repository_service_answers_as_the_v2_one(server: Server) -> None:
    """MLServer's older inference.model_repository service: the same messages (field for
    field) and answers as GRPCInferenceService's repository RPCs."""
    services = (
        "inference.model_repository.ModelRepositoryService",
        "inference.GRPCInferenceService",
    )
    with grpc.insecure_channel(server.grpc_address) as channel:
        index = [channel.unary_unary(f"/{s}/RepositoryIndex")(b"", timeout=30) for s in services]
        assert index[0] == index[1] and b"iris-rf" in index[0]
        unknown = b"\x12\x07nothing"  # RepositoryModelLoadRequest(model_name="nothing")
        for service in services:
            with pytest.raises(grpc.RpcError) as raised:
                channel.unary_unary(f"/{service}/RepositoryModelLoad")(unknown, timeout=30)
            assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_repository_index_answers_get_and_post_alike(server: Server) -> None:
    posted = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=30)
    got = httpx.get(f"{server.url}/v2/repository/index", timeout=30)
    assert posted.status_code == got.status_code == 200
    assert posted.json() == got.json()
    assert {entry["name"] for entry in got.json()} == {"iris-logreg", "iris-rf"}
    assert all(entry["reason"] == "" for entry in got.json())


def test_the_server_metadata_names_inferpool(server: Server) -> None:
    body = httpx.get(f"{server.url}/v2", timeout=30).json()
    assert body["name"] == "inferpool" and body["version"] == __version__
    assert "model_repository" in body["extensions"]
