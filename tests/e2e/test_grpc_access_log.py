"""The access log of both frontends: one line per request with --access-log, none without
(every field of an inference's line: tests/e2e/test_request_id.py)."""

from __future__ import annotations

import time

import grpc
import httpx
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import iris_data
from tests.support.grpc import IMPLEMENTATIONS, infer_request, running_server, stub_for

PEER = r"peer=127\.0\.0\.1:\d+"
LATENCY = r"time=\d+\.\d\dms"
ANY_ID = r"request_id=[0-9a-f-]+"


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_access_log_lines_for_rest_and_grpc(implementation, iris_repo):
    X, _ = iris_data()
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [1, 2, 3, 4]}]}
    with (
        running_server(iris_repo, 0, "--access-log", implementation=implementation) as server,
        stub_for(server) as stub,
    ):
        assert httpx.post(f"{server.url}/v2/models/iris-rf/infer", json=body).status_code == 200
        assert httpx.get(f"{server.url}/v2/models/nope").status_code == 404
        stub.ModelInfer(infer_request("iris-logreg", x=X[:1]))
        stub.ModelMetadata(pb.ModelMetadataRequest(name="iris-rf"))
        with pytest.raises(grpc.RpcError):
            stub.ModelInfer(infer_request("nope", x=X[:1]))
        patterns = [
            rf"REST POST /v2/models/iris-rf/infer {PEER} model=iris-rf version=- status=200 "
            rf"rows=1 {LATENCY} {ANY_ID}",
            # Not an inference: no id of its own (a client's x-request-id would be shown).
            rf"REST GET /v2/models/nope {PEER} model=nope version=- status=404 rows=0 "
            rf"{LATENCY} request_id=-",
            rf"gRPC ModelInfer {PEER} model=iris-logreg version=- status=OK rows=1 {LATENCY} "
            rf"{ANY_ID}",
            rf"gRPC ModelMetadata {PEER} model=iris-rf version=- status=OK rows=0 {LATENCY} "
            rf"request_id=-",
            rf"gRPC ModelInfer {PEER} model=nope version=- status=NOT_FOUND rows=0 {LATENCY} "
            rf"{ANY_ID}",
        ]
        server.expect_lines(patterns)


def test_no_access_log_by_default(iris_server):
    X, _ = iris_data()
    with stub_for(iris_server) as stub:
        stub.ModelInfer(infer_request("iris-logreg", x=X[:1]))
    assert httpx.get(f"{iris_server.url}/v2/models/iris-rf").status_code == 200
    time.sleep(0.2)
    output = iris_server.output()
    assert "inferpool.access" not in output
    assert "ModelInfer" not in output
