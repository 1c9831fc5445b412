"""A request's priority (``protocol/priority.py``): the values it takes, the header's
form, and where the worker finds it in a V2 JSON body and a ModelInferRequest."""

from __future__ import annotations

import orjson
import pytest

from inferpool.errors import BadRequest
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.priority import MAX_LEVEL, body_level, header_level, level_of

TENSOR = {"name": "x", "datatype": "FP64", "shape": [1], "data": [1.0]}


def test_levels_are_whole_numbers_from_0_to_2_64_minus_1() -> None:
    assert level_of(0) == 0 and level_of(1) == 1 and level_of(70000) == MAX_LEVEL
    assert level_of(2**64 - 1) == MAX_LEVEL
    for bad in (-1, 2**64, 1.0, True, "1", None):
        with pytest.raises(BadRequest, match="whole number from 0"):
            level_of(bad)


def test_the_header_takes_digits_only() -> None:
    assert header_level(b"3") == 3 and header_level(" 12 ") == 12 and header_level("0") == 0
    for bad in (b"-1", b"1.5", b"high", b"", "\u0663"):  # an Arabic-Indic 3 is no ASCII digit
        with pytest.raises(BadRequest, match="inferpool-priority must be"):
            header_level(bad)


def test_a_json_body_says_it_in_its_parameters() -> None:
    def body(**document: object) -> bytes:
        return orjson.dumps({"inputs": [TENSOR], **document})

    assert body_level(False, body(), None) == 0
    assert body_level(False, body(parameters={"priority": 4}), None) == 4
    # Only the request's own parameters count, not a tensor's or a stray word.
    tensor = {**TENSOR, "parameters": {"priority": 2}}
    assert body_level(False, orjson.dumps({"inputs": [tensor], "id": "priority"}), None) == 0
    assert body_level(False, b'{"parameters": {"priority": 1}', None) == 0  # decode's 400
    with pytest.raises(BadRequest):
        body_level(False, body(parameters={"priority": "high"}), None)
    # With binary tensors after it, only the JSON part is read.
    document = body(parameters={"priority": 7})
    assert body_level(False, document + b'"priority"' * 3, len(document)) == 7


def test_a_model_infer_request_says_it_in_its_parameters_map() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(b"priority")  # the word in the data: not a parameter
    request.parameters["other"].string_param = "priority"
    assert body_level(True, request.SerializeToString(), None) == 0
    request.parameters["priority"].uint64_param = 9
    assert body_level(True, request.SerializeToString(), None) == 9
    request.parameters["priority"].int64_param = 3
    assert body_level(True, request.SerializeToString(), None) == 3
    for field, value in (("int64_param", -2), ("string_param", "1"), ("double_param", 1.0)):
        setattr(request.parameters["priority"], field, value)
        with pytest.raises(BadRequest):
            body_level(True, request.SerializeToString(), None)
    assert body_level(True, b"\xff\xff", None) == 0  # no message: the decode answers
