"""The wire formats' side of the system shared-memory extension: region parameters, the
placeholder inputs (only while a worker resolves them), and gRPC's raw contents beside
inputs in regions."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from inferpool.errors import BadRequest
from inferpool.protocol import grpc_wire, rest_json
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.shared_memory import resolving, tensor_region
from inferpool.protocol.types import Tensor


def _request(raw_entries: int) -> bytes:
    message = pb.ModelInferRequest(model_name="m")
    in_region = message.inputs.add(name="a", datatype="FP32", shape=[2])
    in_region.parameters["shared_memory_region"].string_param = "r"
    in_region.parameters["shared_memory_byte_size"].int64_param = 8
    message.inputs.add(name="b", datatype="FP32", shape=[2])
    for _ in range(raw_entries):
        message.raw_input_contents.append(np.array([1, 2], dtype="<f4").tobytes())
    return message.SerializeToString()


def test_grpc_raw_contents_go_to_the_inputs_outside_regions():
    with resolving():
        request = grpc_wire.decode(_request(1))
    assert request.inputs[0].data.size == 0  # filled later, from the region
    assert request.inputs[1].data.tolist() == [1.0, 2.0]


def test_grpc_raw_contents_must_match_the_inputs_outside_regions():
    with resolving(), pytest.raises(BadRequest, match="raw_input_contents has 3 entries for 2"):
        grpc_wire.decode(_request(3))


UNREGISTERED = "input 'a' names shared memory region 'r', which is not registered"


def test_an_input_in_a_region_is_refused_unless_resolved():
    with pytest.raises(BadRequest, match=UNREGISTERED):
        grpc_wire.decode(_request(1))
    parameters = {"shared_memory_region": "r", "shared_memory_byte_size": 8}
    tensor = {"name": "a", "datatype": "FP32", "shape": [2], "parameters": parameters}
    body = orjson.dumps({"inputs": [tensor]})
    with pytest.raises(BadRequest, match=UNREGISTERED):
        rest_json.decode_request(body)
    with resolving():
        assert rest_json.decode_request(body).inputs[0].data.size == 0


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"shared_memory_region": ""}, "shared_memory_region must be a region's name"),
        ({"shared_memory_region": "r"}, "names region 'r' but has no shared_memory_byte_size"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, "non-negative integer"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": True}, "non-negative integer"),
        (
            {
                "shared_memory_region": "r",
                "shared_memory_byte_size": 8,
                "shared_memory_offset": "4",
            },
            "shared_memory_offset must be a non-negative integer",
        ),
    ],
)
def test_region_parameters_are_checked(parameters, message):
    with pytest.raises(BadRequest, match=message):
        tensor_region(parameters, "t", "input")


def test_an_output_in_a_region_has_no_data_in_json():
    parameters = {"shared_memory_region": "r", "shared_memory_byte_size": 8}
    output = Tensor("y", "FP32", (2,), np.empty(0), parameters)
    assert rest_json.output_document(output) == {
        "name": "y", "shape": [2], "datatype": "FP32", "parameters": parameters,
    }  # fmt: skip
