"""The request id of an inference, end to end: the x-request-id header or metadata first,
then the V2 ``id``, else generated; echoed in the REST response header and in gRPC's
trailing metadata (both implementations), with --workers 0 and 2; and the access log line
with every field (``frontends/request_context.py``, ``frontends/access_log.py``)."""

from __future__ import annotations

import re
import uuid

import grpc
import httpx
import pytest

from tests.support import Server, iris_data
from tests.support.grpc import infer_request, needs_pool, running_server, stub_for

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [1, 2, 3, 4]}]}
GENERATED = re.compile(r"^[0-9a-f]{8}-[0-9a-f]+$")  # request_context.generate()
# Each worker count and each gRPC implementation once (two servers, not four: the id is
# resolved in the frontend, the same whoever runs the model).
SETUPS = [
    pytest.param((2, "builtin"), id="builtin-w2", marks=needs_pool),
    pytest.param((0, "grpcio"), id="grpcio-w0"),
]


@pytest.fixture(scope="module", params=SETUPS)
def server(request, iris_repo):
    workers, implementation = request.param
    with running_server(iris_repo, workers, "--access-log", implementation=implementation) as s:
        yield s


def post(server: Server, body: dict, headers: dict | None = None, model: str = "iris-rf"):
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, headers=headers)


def grpc_request(model: str = "iris-logreg", request_id: str = "", version: str = ""):
    X, _ = iris_data()
    request = infer_request(model, x=X[:1])
    request.id = request_id
    request.model_version = version
    return request


def trailing_id(metadata) -> str:
    found = [value for key, value in metadata if key == "x-request-id"]
    assert len(found) == 1, metadata
    return found[0]


def new_id() -> str:
    return f"test-{uuid.uuid4()}"


# -- REST --------------------------------------------------------------------------------
def test_rest_echoes_the_header_first(server):
    given = new_id()
    response = post(server, BODY, {"x-request-id": given})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == given
    # Over the V2 id too, which the response body still carries.
    response = post(server, {**BODY, "id": "the-v2-id"}, {"x-request-id": given})
    assert response.headers["x-request-id"] == given
    assert response.json()["id"] == "the-v2-id"


def test_rest_takes_the_v2_id_without_a_header(server):
    response = post(server, {**BODY, "id": 'v2 "quoted" \\ id'})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == 'v2 "quoted" \\ id'


def test_rest_generates_a_unique_id_the_response_carries(server):
    first, second = post(server, BODY), post(server, BODY)
    assert first.status_code == second.status_code == 200
    assert first.headers["x-request-id"] == first.json()["id"]
    assert second.headers["x-request-id"] == second.json()["id"]
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


def test_rest_errors_carry_the_id(server):
    given = new_id()
    assert (
        post(server, BODY, {"x-request-id": given}, model="nope").headers["x-request-id"] == given
    )
    # Failed before any worker answered (404) or answered with an error (400): generated.
    unknown = post(server, BODY, model="nope")
    invalid = httpx.post(f"{server.url}/v2/models/iris-rf/infer", content=b"{not json")
    assert (unknown.status_code, invalid.status_code) == (404, 400)
    ids = {unknown.headers["x-request-id"], invalid.headers["x-request-id"]}
    assert len(ids) == 2
    assert all(GENERATED.match(i) for i in ids), ids


def test_rest_refuses_an_unusable_id(server):
    response = post(server, BODY, {"x-request-id": "x" * 257})
    assert response.status_code == 400
    assert "x-request-id must be 1 to 256 printable ASCII characters" in response.json()["error"]
    assert GENERATED.match(response.headers["x-request-id"])


# -- gRPC --------------------------------------------------------------------------------
def test_grpc_echoes_the_metadata_first(server):
    given = new_id()
    with stub_for(server) as stub:
        response, call = stub.ModelInfer.with_call(
            grpc_request(request_id="the-v2-id"), metadata=(("x-request-id", given),)
        )
    assert trailing_id(call.trailing_metadata()) == given
    assert response.id == "the-v2-id"


def test_grpc_takes_the_request_id_field(server):
    with stub_for(server) as stub:
        _, call = stub.ModelInfer.with_call(grpc_request(request_id="v2-grpc-id"))
    assert trailing_id(call.trailing_metadata()) == "v2-grpc-id"


def test_grpc_generates_a_unique_id_the_response_carries(server):
    with stub_for(server) as stub:
        first, first_call = stub.ModelInfer.with_call(grpc_request())
        second, second_call = stub.ModelInfer.with_call(grpc_request())
    assert trailing_id(first_call.trailing_metadata()) == first.id
    assert trailing_id(second_call.trailing_metadata()) == second.id
    assert first.id and first.id != second.id


def test_grpc_errors_carry_the_id(server):
    given = new_id()
    with stub_for(server) as stub:
        with pytest.raises(grpc.RpcError) as given_error:
            stub.ModelInfer(grpc_request("nope"), metadata=(("x-request-id", given),))
        with pytest.raises(grpc.RpcError) as first:
            stub.ModelInfer(grpc_request("nope"))
        with pytest.raises(grpc.RpcError) as second:
            stub.ModelInfer(grpc_request("nope"))
        with pytest.raises(grpc.RpcError) as unusable:
            stub.ModelInfer(grpc_request(), metadata=(("x-request-id", "x" * 257),))
    assert given_error.value.code() == grpc.StatusCode.NOT_FOUND
    assert trailing_id(given_error.value.trailing_metadata()) == given
    generated = [trailing_id(e.value.trailing_metadata()) for e in (first, second)]
    assert generated[0] != generated[1]
    assert all(GENERATED.match(i) for i in generated), generated
    assert unusable.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-request-id must be 1 to 256" in unusable.value.details()


# -- the access log ----------------------------------------------------------------------


def test_the_access_log_line_has_every_field(server):
    rest_id, grpc_id, rest_missing, grpc_missing = (new_id() for _ in range(4))
    assert post(server, BODY, {"x-request-id": rest_id}).status_code == 200
    missing = httpx.post(
        f"{server.url}/v2/models/iris-rf/versions/7/infer",
        json=BODY,
        headers={"x-request-id": rest_missing},
    )
    assert missing.status_code == 404
    with stub_for(server) as stub:
        stub.ModelInfer(grpc_request(), metadata=(("x-request-id", grpc_id),))
        with pytest.raises(grpc.RpcError):
            stub.ModelInfer(grpc_request(version="7"), metadata=(("x-request-id", grpc_missing),))
    peer = r"peer=127\.0\.0\.1:\d+"
    ms = r"time=\d+\.\d\dms"
    patterns = [
        rf"REST POST /v2/models/iris-rf/infer {peer} model=iris-rf version=- status=200 "
        rf"rows=1 {ms} request_id={rest_id}",
        rf"REST POST /v2/models/iris-rf/versions/7/infer {peer} model=iris-rf version=7 "
        rf"status=404 rows=0 {ms} request_id={rest_missing}",
        rf"gRPC ModelInfer {peer} model=iris-logreg version=- status=OK rows=1 {ms} "
        rf"request_id={grpc_id}",
        rf"gRPC ModelInfer {peer} model=iris-logreg version=7 status=NOT_FOUND rows=0 {ms} "
        rf"request_id={grpc_missing}",
    ]
    server.expect_lines(patterns)
