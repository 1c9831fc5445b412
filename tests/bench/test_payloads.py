"""Payload generation: the bytes each protocol sends decode back to the same tensor, and
responses of every kind decode to the predictions that the check compares."""

import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from benchmarks.payloads import (
    BINARY_HEADER,
    GRPC_INFER_PATH,
    batch_rows,
    build_payload,
    decode_grpc_response,
    decode_rest_response,
    grpc_frame,
    grpc_unframe,
    predictions_match,
)

X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7  # values without short float64 reprs
EXPECTED = np.array([0, 1, 2])


def test_batch_rows_cycles_through_a_short_dataset():
    rows = batch_rows(X, 7)
    assert rows.shape == (7, 4) and rows.dtype == np.float32
    assert np.array_equal(rows[3], X[0]) and np.array_equal(rows[6], X[0])
    assert rows.flags.c_contiguous


def test_rest_json_body_round_trips_float32_exactly_and_compactly():
    payload = build_payload("iris", 3, "rest-json", X, EXPECTED)
    assert payload.path == "/v2/models/iris/infer"
    assert payload.headers["Content-Type"] == "application/json"
    tensor = json.loads(payload.body)["inputs"][0]
    assert tensor["shape"] == [3, 4] and tensor["datatype"] == "FP32"
    assert np.array_equal(np.asarray(tensor["data"], dtype=np.float32), X.ravel())
    # float32 shortest repr ("0.14285715"), not the float64 expansion of the same value
    assert "0.14285715," in payload.body.decode()


def test_rest_binary_body_is_json_header_then_raw_tensor():
    payload = build_payload("iris", 3, "rest-binary", X, EXPECTED)
    header_len = int(payload.headers[BINARY_HEADER])
    header = json.loads(payload.body[:header_len])
    tensor = header["inputs"][0]
    assert tensor["parameters"]["binary_data_size"] == X.nbytes
    assert "data" not in tensor
    raw = np.frombuffer(payload.body[header_len:], dtype="<f4")
    assert np.array_equal(raw, X.ravel())


@pytest.mark.parametrize("protocol", ["grpc-typed", "grpc-raw"])
def test_grpc_payload_is_one_framed_model_infer_request(protocol):
    payload = build_payload("iris", 3, protocol, X, EXPECTED)
    assert payload.path == GRPC_INFER_PATH and payload.transport == "grpc"
    assert payload.headers == {"content-type": "application/grpc", "te": "trailers"}
    assert (
        payload.body[0] == 0 and int.from_bytes(payload.body[1:5], "big") == len(payload.body) - 5
    )
    request = service_pb2.ModelInferRequest.FromString(grpc_unframe(payload.body))
    assert request.model_name == "iris"
    assert list(request.inputs[0].shape) == [3, 4]
    if protocol == "grpc-raw":
        sent = np.frombuffer(request.raw_input_contents[0], dtype="<f4")
        assert not request.inputs[0].contents.fp32_contents
    else:
        sent = np.asarray(request.inputs[0].contents.fp32_contents, dtype=np.float32)
        assert not request.raw_input_contents
    assert np.array_equal(sent, X.ravel())


def test_unknown_protocol_is_rejected():
    with pytest.raises(ValueError, match="unknown protocol"):
        build_payload("iris", 3, "soap", X, EXPECTED)


def test_grpc_unframe_rejects_compressed_or_truncated_frames():
    assert grpc_unframe(grpc_frame(b"abc")) == b"abc"
    with pytest.raises(ValueError):
        grpc_unframe(b"\x01" + grpc_frame(b"abc")[1:])
    with pytest.raises(ValueError):
        grpc_unframe(grpc_frame(b"abc")[:-1])


def test_decode_rest_json_and_binary_responses():
    document = {
        "model_name": "m",
        "outputs": [{"name": "predict", "shape": [3], "datatype": "INT64", "data": [0, 1, 2]}],
    }
    got = decode_rest_response({}, json.dumps(document).encode())
    assert got.dtype == np.int64 and list(got) == [0, 1, 2]

    scores = np.array([0.25, 0.5, 0.75])
    output = {
        "name": "predict",
        "shape": [3],
        "datatype": "FP64",
        "parameters": {"binary_data_size": scores.nbytes},
    }
    header = json.dumps({"outputs": [output]}).encode()
    got = decode_rest_response({BINARY_HEADER.lower(): str(len(header))}, header + scores.tobytes())
    assert np.array_equal(got, scores)


def test_decode_rest_response_without_outputs_fails():
    with pytest.raises(ValueError, match="no outputs"):
        decode_rest_response({}, b'{"error": "boom"}')


def test_decode_grpc_typed_and_raw_responses():
    typed = service_pb2.ModelInferResponse(model_name="m")
    out = typed.outputs.add(name="predict", datatype="INT64", shape=[3])
    out.contents.int64_contents.extend([2, 1, 0])
    assert list(decode_grpc_response(typed.SerializeToString())) == [2, 1, 0]

    raw = service_pb2.ModelInferResponse(model_name="m")
    raw.outputs.add(name="predict", datatype="FP32", shape=[2])
    raw.raw_output_contents.append(np.array([0.5, 0.25], dtype="<f4").tobytes())
    assert list(decode_grpc_response(raw.SerializeToString())) == [0.5, 0.25]


@pytest.mark.parametrize(
    ("got", "expected", "match"),
    [
        ([0, 1, 2], np.array([0, 1, 2]), True),
        ([0, 1, 1], np.array([0, 1, 2]), False),
        ([0, 1], np.array([0, 1, 2]), False),
        ([0.2, 0.9], np.array([0.2000001, 0.9]), True),
        ([0.2, 0.9], np.array([0.3, 0.9]), False),
        ([0, 1], np.array([0.2, 0.9]), True),  # labels where the harness has scores
        ([1, 1], np.array([0.2, 0.9]), False),
    ],
)
def test_predictions_match_by_value(got, expected, match):
    assert predictions_match(np.asarray(got), expected) is match
