"""Triton's binary tensor data extension on REST, with tritonclient.http, both directions.

An identity model (the echo runtime mirroring its inputs) declares one input and one
output per V2 datatype, named after it.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.http as triton

from inferpool.protocol.datatypes import NUMPY_BY_DATATYPE
from tests.support import Server
from tests.support.runtimes import write_echo_model

DATATYPES = list(NUMPY_BY_DATATYPE)


def sample(datatype: str, utf8_only: bool = False) -> np.ndarray:
    """A [2, 3] tensor with the datatype's extremes (and NaN/inf for floats)."""
    if datatype == "BYTES":
        raw = [b"abc", "ü∂".encode(), b"", b"\x00\xff", b"x" * 300, b"z"]
        if utf8_only:
            raw[3] = b"nul\x00"
        return np.array(raw, dtype=object).reshape(2, 3)
    dtype = NUMPY_BY_DATATYPE[datatype]
    if dtype.kind == "b":
        values = [True, False, True, True, False, False]
    elif dtype.kind == "f":
        info = np.finfo(dtype)
        values = [info.min, info.max, np.nan, np.inf, -np.inf, 0.1]
    else:
        info = np.iinfo(dtype)
        values = [info.min, info.max, 0, 1, info.max - 1, info.min + 1]
    return np.array(values, dtype=dtype).reshape(2, 3)


def same(got: np.ndarray, expected: np.ndarray) -> bool:
    if expected.dtype == object:
        as_bytes = [g if isinstance(g, bytes) else g.encode() for g in got.reshape(-1).tolist()]
        return got.shape == expected.shape and as_bytes == expected.reshape(-1).tolist()
    return got.dtype == expected.dtype and np.array_equal(
        got, expected, equal_nan=expected.dtype.kind == "f"
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("binary-repo")
    outputs = [{"name": dt.lower(), "datatype": dt, "shape": [-1, 3]} for dt in DATATYPES]
    write_echo_model(root, "identity", outputs)
    with Server(root, "--workers", "0") as running:
        running.wait_ready()
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as connection:
        yield connection


def request_input(datatype: str, array: np.ndarray, binary: bool) -> triton.InferInput:
    tensor = triton.InferInput(datatype.lower(), list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize(
    ("binary_in", "binary_out"),
    [(True, True), (False, False), (True, False), (False, True)],
    ids=["binary", "json", "binary-in", "binary-out"],
)
def test_every_datatype_round_trips(client, datatype, binary_in, binary_out) -> None:
    array = sample(datatype, utf8_only=not (binary_in and binary_out))
    name = datatype.lower()
    result = client.infer(
        "identity",
        [request_input(datatype, array, binary_in)],
        outputs=[triton.InferRequestedOutput(name, binary_data=binary_out)],
    )
    output = result.get_output(name)
    assert ("binary_data_size" in output.get("parameters", {})) == binary_out
    assert ("data" in output) != binary_out
    assert same(result.as_numpy(name), array)


def test_no_requested_outputs_means_all_binary(client) -> None:
    arrays = {dt: sample(dt) for dt in ("FP32", "INT8", "BYTES")}
    result = client.infer(
        "identity", [request_input(dt, array, True) for dt, array in arrays.items()]
    )
    for datatype, array in arrays.items():
        output = result.get_output(datatype.lower())
        assert output["parameters"]["binary_data_size"] > 0
        assert same(result.as_numpy(datatype.lower()), array)


def test_binary_reply_carries_the_header_and_json_length(server: Server) -> None:
    document = {
        "inputs": [{"name": "int32", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}],
        "outputs": [{"name": "int32", "parameters": {"binary_data": True}}],
    }
    response = httpx.post(f"{server.url}/v2/models/identity/infer", json=document, timeout=30)
    assert response.status_code == 200
    json_length = int(response.headers["Inference-Header-Content-Length"])
    header = orjson.loads(response.content[:json_length])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 12
    assert "binary_data_output" not in header["parameters"]
    tail = np.frombuffer(response.content[json_length:], dtype="<i4")
    assert tail.tolist() == [1, 2, 3]


def test_json_reply_has_no_binary_header(server: Server) -> None:
    document = {
        "inputs": [{"name": "uint8", "datatype": "UINT8", "shape": [1, 3], "data": [1, 2, 3]}]
    }
    response = httpx.post(f"{server.url}/v2/models/identity/infer", json=document, timeout=30)
    assert response.status_code == 200
    assert "Inference-Header-Content-Length" not in response.headers
    assert response.json()["outputs"][0]["data"] == [1, 2, 3]


@pytest.mark.parametrize(
    ("size", "json_length_delta", "message"),
    [
        (13, 0, "runs past the body"),
        (8, 0, "needs 12 bytes, got 8"),
        (12, 10_000, "Inference-Header-Content-Length"),
    ],
)
def test_bad_binary_request_is_a_400(server, size, json_length_delta, message) -> None:
    tensor = {"name": "int32", "datatype": "INT32", "shape": [1, 3]}
    header = orjson.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": size}}]})
    body = header + np.arange(3, dtype="<i4").tobytes()[:size]
    response = httpx.post(
        f"{server.url}/v2/models/identity/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(len(header) + json_length_delta)},
        timeout=30,
    )
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_binary_data_flag_must_be_a_boolean(server: Server) -> None:
    document = {
        "inputs": [{"name": "int8", "datatype": "INT8", "shape": [1, 3], "data": [1, 2, 3]}],
        "parameters": {"binary_data_output": "yes"},
    }
    response = httpx.post(f"{server.url}/v2/models/identity/infer", json=document, timeout=30)
    assert response.status_code == 400
    assert "binary_data_output" in response.json()["error"]
