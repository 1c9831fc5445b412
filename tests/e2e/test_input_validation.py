"""Hostile and rejected input on a real server (issue 12): a 114-byte request that declares
3x10^8 BYTES elements is refused at once without the worker allocating or dying, and input
the model refuses (NaN, no rows, strings, the wrong feature count) is a 400 naming the input,
over REST and gRPC, with the models in the server process and in workers."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import psutil
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, build_iris_repository, iris_data
from tests.support.grpc import stub_for
from tests.support.pool import worker_pids

LIE = 300_000_000
MODEL = "iris-logreg"
TENSOR_BYTES = 100_000


@pytest.fixture(scope="module", params=[0, 2], ids=["workers0", "workers2"])
def server(request, tmp_path_factory) -> Iterator[Server]:
    repository = build_iris_repository(tmp_path_factory.mktemp("repo"))
    # A small tensor-bytes limit (iris requests are tiny) and the default element limit.
    flags = ("--workers", str(request.param), "--max-request-tensor-bytes", str(TENSOR_BYTES))
    with Server(repository, *flags) as running:
        running.wait_ready()
        running.workers = request.param
        yield running


def lying_rest_body() -> tuple[bytes, int]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [LIE],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 8},
                }
            ]
        },
        separators=(",", ":"),
    ).encode()
    return header + b"\x04\x00\x00\x00abcd", len(header)


def lying_grpc_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="x", datatype="BYTES", shape=[LIE])
    request.raw_input_contents.append(b"\x04\x00\x00\x00abcd")
    return request


def rss_of(pids: list[int]) -> int:
    return max(psutil.Process(pid).memory_info().rss for pid in pids)


def serving_pids(server: Server) -> list[int]:
    if server.workers == 0:
        return [server.process.pid]
    return sorted(worker_pids(server).values())


def test_the_114_byte_lie_is_refused_at_once_and_nothing_dies(server):
    body, json_length = lying_rest_body()
    assert len(body) <= 114
    pids = serving_pids(server)
    assert len(pids) == max(1, server.workers)
    url = f"{server.url}/v2/models/{MODEL}/infer"
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(json_length),
    }
    with stub_for(server) as stub:
        for _ in range(3):  # more than once: each worker may see one
            started = time.monotonic()
            response = httpx.post(url, content=body, headers=headers, timeout=10)
            assert time.monotonic() - started < 1.0
            assert response.status_code == 400
            assert "input 'x'" in response.json()["error"]
            assert "max_tensor_elements" in response.json()["error"]

            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(lying_grpc_request(), timeout=10)
            assert time.monotonic() - started < 1.0
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "input 'x'" in caught.value.details()
    # The same processes serve, and none of them took the gigabytes the shape asked for.
    assert serving_pids(server) == pids
    assert rss_of(pids) < 600 * 1024 * 1024
    X, _ = iris_data()
    good = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": X[:1].tolist()}]}
    assert httpx.post(url, json=good, timeout=10).status_code == 200


def rows(count: int = 2) -> np.ndarray:
    return np.asarray(iris_data()[0][:count], dtype=float)


REJECTED = {
    # case: (shape, datatype, data, what the message says)
    "nan": ([2, 4], "FP64", [*rows().ravel()[:5], math.nan, 1.0, 1.0], "NaN"),
    "zero-rows": ([0, 4], "FP64", [], "needs at least one row"),
    "strings": ([1, 4], "BYTES", ["a", "b", "c", "d"], "could not convert string to float"),
    "features": ([2, 3], "FP64", rows().ravel()[:6].tolist(), "expects 4 features, got 3"),
}


@pytest.mark.parametrize("case", list(REJECTED))
def test_input_the_model_rejects_is_400_naming_the_input_over_rest(server, case):
    shape, datatype, data, says = REJECTED[case]
    tensor = {"name": "x", "shape": shape, "datatype": datatype, "data": list(data)}
    # Python's json writes NaN as a bare literal, as tritonclient and MLServer do.
    response = httpx.post(
        f"{server.url}/v2/models/{MODEL}/infer",
        content=json.dumps({"inputs": [tensor]}),
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error.startswith(f"model '{MODEL}' rejected input 'x': ") and says in error


@pytest.mark.parametrize("case", list(REJECTED))
def test_input_the_model_rejects_is_invalid_argument_naming_the_input_over_grpc(server, case):
    shape, datatype, data, says = REJECTED[case]
    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="x", datatype=datatype, shape=shape)
    if datatype == "BYTES":
        tensor.contents.bytes_contents.extend(item.encode() for item in data)
    else:
        tensor.contents.fp64_contents.extend(data)
    with stub_for(server) as stub, pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=10)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    details = caught.value.details()
    assert details.startswith(f"model '{MODEL}' rejected input 'x': ") and says in details


def test_duplicate_input_names_are_400_over_rest_and_grpc(server):
    tensor = {"name": "x", "shape": [1, 4], "datatype": "FP64", "data": rows(1).ravel().tolist()}
    response = httpx.post(
        f"{server.url}/v2/models/{MODEL}/infer", json={"inputs": [tensor, tensor]}, timeout=10
    )
    assert (response.status_code, response.json()["error"]) == (400, "input 'x' appears twice")
    request = pb.ModelInferRequest(model_name=MODEL)
    for _ in range(2):
        request.inputs.add(name="x", datatype="FP64", shape=[1, 4]).contents.fp64_contents.extend(
            rows(1).ravel().tolist()
        )
    with stub_for(server) as stub, pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=10)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_tensor_bytes_over_the_limit_are_413_and_resource_exhausted(server):
    # 4 x 4000 FP64 values: 128,000 bytes declared, over the server's 100,000.
    values = np.zeros((4000, 4))
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [4000, 4],
                    "datatype": "FP64",
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ]
        }
    ).encode()
    response = httpx.post(
        f"{server.url}/v2/models/{MODEL}/infer",
        content=header + values.tobytes(),
        headers={
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        },
        timeout=10,
    )
    assert response.status_code == 413, response.text
    assert "max_request_tensor_bytes" in response.json()["error"]
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="x", datatype="FP64", shape=[4000, 4])
    request.raw_input_contents.append(values.tobytes())
    with stub_for(server) as stub, pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=10)
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_request_tensor_bytes" in caught.value.details()
