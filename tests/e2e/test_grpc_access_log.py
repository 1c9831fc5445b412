"""The access log of both frontends: one line per request with --access-log, none without."""

from __future__ import annotations

import re
import time

import grpc
import httpx
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, iris_data
from tests.support.grpc import IMPLEMENTATIONS, infer_request, running_server, stub_for

LATENCY = r"\d+\.\d\dms"


def wait_for_lines(server: Server, patterns: list[str], timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while True:
        output = server.output()
        if all(re.search(p, output) for p in patterns) or time.monotonic() > deadline:
            return output
        time.sleep(0.05)


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
            rf"REST POST /v2/models/iris-rf/infer model=iris-rf status=200 {LATENCY}",
            rf"REST GET /v2/models/nope model=nope status=404 {LATENCY}",
            rf"gRPC ModelInfer model=iris-logreg status=OK {LATENCY}",
            rf"gRPC ModelMetadata model=iris-rf status=OK {LATENCY}",
            rf"gRPC ModelInfer model=nope status=NOT_FOUND {LATENCY}",
        ]
        output = wait_for_lines(server, patterns)
    for pattern in patterns:
        assert re.search(pattern, output), f"{pattern!r} not in the log:\n{output}"


def test_no_access_log_by_default(iris_server):
    X, _ = iris_data()
    with stub_for(iris_server) as stub:
        stub.ModelInfer(infer_request("iris-logreg", x=X[:1]))
    assert httpx.get(f"{iris_server.url}/v2/models/iris-rf").status_code == 200
    time.sleep(0.2)
    output = iris_server.output()
    assert "inferpool.access" not in output
    assert "ModelInfer" not in output
