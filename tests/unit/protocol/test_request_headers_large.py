"""A large tensor behind a custom runtime's headers block: the block is cut off by a view,
not a copy, both ways, and the response's block is written in the same join as the
outputs (``request_headers``, ``rest_wire.encode``'s prefix)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferpool.frontends.rest.body import ALIGN, alignment
from inferpool.protocol import grpc_headers_wire, rest_headers_wire
from inferpool.protocol.request_headers import VIEW_FROM, headers_block, unwrap, wrap
from inferpool.protocol.types import InferenceResponse, Tensor

SIZE = VIEW_FROM  # bytes of tensor data: the views start here


def _binary_request(data: np.ndarray) -> tuple[bytes, int]:
    header = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [data.size],
                "parameters": {"binary_data_size": data.nbytes},
            }
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }
    document = json.dumps(header).encode()
    return document + data.tobytes(), len(document)


def test_a_large_request_is_decoded_from_a_view_behind_its_headers_block() -> None:
    data = np.arange(SIZE // 4, dtype=np.float32)
    body, json_length = _binary_request(data)
    # As the REST route reads it: the block padded so that the tensor is aligned.
    pad = alignment(len(headers_block({"x-a": "1"})), str(json_length).encode())
    buffer = bytearray(headers_block({"x-a": "1"}, pad) + body)
    assert (len(buffer) - len(body) + json_length) % ALIGN == 0
    request = rest_headers_wire.decode(buffer, json_length)  # type: ignore[arg-type]
    assert request.parameters["headers"] == {"x-a": "1"}
    decoded = request.inputs[0].data
    assert np.array_equal(decoded, data)
    assert np.shares_memory(decoded, np.frombuffer(buffer, np.uint8))  # no copy of the tail


def test_a_large_response_carries_its_block_in_the_same_join_and_is_unwrapped_by_a_view() -> None:
    data = np.arange(SIZE // 4, dtype=np.float32)
    body, json_length = _binary_request(data)
    request = rest_headers_wire.decode(wrap({}, body), json_length)
    output = Tensor("y", "FP32", (data.size,), data)
    response = InferenceResponse("m", [output], parameters={"headers": {"x-b": "2\n3"}})
    encoded, document_length = rest_headers_wire.encode(response, request)
    assert "headers" not in response.parameters
    headers, rest = unwrap(encoded, view=True)
    assert headers == {"x-b": "2 3"}
    assert isinstance(rest, memoryview) and rest.obj is encoded  # a view, not a copy
    assert document_length is not None
    assert bytes(rest[document_length:]) == data.tobytes()
    assert unwrap(encoded) == (headers, bytes(rest))  # the copying form, as gRPC uses it


def test_a_small_body_is_cut_by_a_slice() -> None:
    headers, rest = unwrap(wrap({"a": "b"}, b"tiny"), view=True)
    assert (headers, rest) == ({"a": "b"}, b"tiny") and type(rest) is bytes


def test_grpc_responses_keep_their_block_in_front() -> None:
    from tritonclient.grpc import service_pb2

    message = service_pb2.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[2])
    message.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    request = grpc_headers_wire.decode(wrap({"k": "v"}, message.SerializeToString()), None)
    assert request.parameters["headers"] == {"k": "v"}
    response = InferenceResponse("m", request.inputs, parameters={"headers": {"t": "1"}})
    encoded, _ = grpc_headers_wire.encode(response, request)
    headers, rest = unwrap(encoded)
    assert headers == {"t": "1"}
    assert service_pb2.ModelInferResponse.FromString(rest).model_name == "m"


def test_large_raw_grpc_outputs_follow_the_message_from_the_arrays() -> None:
    """From LARGE_RAW bytes on, raw outputs are written after the serialized message (its
    fields may come in any order), copied once from the arrays; a client reads the same
    response as the small path builds."""
    from tritonclient.grpc import service_pb2

    from inferpool.protocol import grpc_wire

    big = np.arange(grpc_wire.LARGE_RAW // 4, dtype=np.float32)
    message = service_pb2.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[big.size])
    message.raw_input_contents.append(big.tobytes())
    request = grpc_wire.decode(message.SerializeToString())
    outputs = [Tensor("a", "FP32", (big.size,), big), Tensor("b", "INT64", (2,), np.arange(2))]
    response = InferenceResponse("m", outputs, id="r1", parameters={"k": "v"})
    encoded, _ = grpc_wire.encode(response, request, b"PREFIX")
    assert encoded[:6] == b"PREFIX"
    read = service_pb2.ModelInferResponse.FromString(encoded[6:])
    assert (read.model_name, read.id, read.parameters["k"].string_param) == ("m", "r1", "v")
    assert [o.name for o in read.outputs] == ["a", "b"] and list(read.outputs[0].shape) == [
        big.size
    ]
    assert read.raw_output_contents[0] == big.tobytes()
    assert read.raw_output_contents[1] == np.arange(2, dtype="<i8").tobytes()
    small, _ = grpc_wire.encode(InferenceResponse("m", outputs[1:]), request)
    assert service_pb2.ModelInferResponse.FromString(small).raw_output_contents[0] == (
        np.arange(2, dtype="<i8").tobytes()
    )


def test_split_field_takes_a_fields_values_out_as_views() -> None:
    from tritonclient.grpc import service_pb2

    from inferpool.protocol.protowire import split_field

    message = service_pb2.ModelInferRequest(model_name="m", id="r")
    message.inputs.add(name="x", datatype="UINT8", shape=[3])
    message.raw_input_contents.extend([b"abc", b"", b"\x00" * 300])
    message.parameters["k"].int64_param = 5
    data = message.SerializeToString()
    rest, found = split_field(data, 7)
    assert [bytes(v) for v in found] == [b"abc", b"", b"\x00" * 300]
    assert all(v.obj is data for v in found)
    parsed = service_pb2.ModelInferRequest.FromString(rest)
    assert not parsed.raw_input_contents
    assert (parsed.model_name, parsed.id, parsed.parameters["k"].int64_param) == ("m", "r", 5)
    for broken in (data[:-1], b"\x00\x01", b"\x0b"):  # truncated, field 0, a group
        with pytest.raises(ValueError):
            split_field(broken, 7)


def test_a_large_raw_grpc_request_is_decoded_in_place() -> None:
    from tritonclient.grpc import service_pb2

    from inferpool.errors import BadRequest
    from inferpool.protocol import grpc_wire

    big = np.arange(grpc_wire.LARGE_RAW // 4, dtype=np.float32)
    for name in ("m", "mm", "mmm", "mmmm"):  # one of them puts the tensor at an aligned offset
        message = service_pb2.ModelInferRequest(model_name=name)
        message.inputs.add(name="x", datatype="FP32", shape=[big.size])
        message.inputs.add(name="y", datatype="INT32", shape=[2])
        message.raw_input_contents.extend([big.tobytes(), np.arange(2, dtype="<i4").tobytes()])
        data = message.SerializeToString()
        if data.find(big.tobytes()[:64]) % 4 == 0:
            break
    request = grpc_wire.decode(data)
    x, y = (tensor.data for tensor in request.inputs)
    assert np.array_equal(x, big) and np.array_equal(y, np.arange(2))
    assert request.raw_contents
    assert np.shares_memory(x, np.frombuffer(data, np.uint8))  # read in place, not parsed
    with pytest.raises(BadRequest, match="not a valid"):
        grpc_wire.decode(data[:-1])
