"""V2 JSON decoding and encoding: shapes, datatypes, range checks, BYTES; response ids."""

import os
import random
import uuid

import numpy as np
import orjson
import pytest

from inferpool.errors import BadRequest
from inferpool.protocol.rest_json import decode_request, encode_response, new_request_id
from inferpool.protocol.types import InferenceResponse, Tensor


def body(**tensor):
    base = {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}
    return orjson.dumps({"inputs": [{**base, **tensor}]})


def test_numeric_input_becomes_a_shaped_array_of_the_datatype():
    (tensor,) = decode_request(body()).inputs
    assert tensor.data.dtype == np.float32
    assert tensor.data.shape == (2, 2)
    assert tensor.data.tolist() == [[1, 2], [3, 4]]


def test_bytes_input_becomes_bytes_objects():
    (tensor,) = decode_request(body(datatype="BYTES", data=["a", "é", "c", "d"])).inputs
    assert tensor.data.dtype == object
    assert tensor.data[0, 1] == "é".encode()


def test_empty_tensor():
    (tensor,) = decode_request(body(shape=[0, 4], data=[], datatype="INT16")).inputs
    assert tensor.data.shape == (0, 4) and tensor.data.dtype == np.int16


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("UINT64", [-1, 0, 0, 0], "out of range"),
        ("INT16", [40000, 0, 0, 0], "out of range"),
        ("FP32", [1e39, 0, 0, 0], "out of range"),
        ("BOOL", [True, False, "yes", True], "true or false"),
    ],
)
def test_values_must_fit_the_datatype(datatype, data, message):
    with pytest.raises(BadRequest, match=message):
        decode_request(body(datatype=datatype, data=data))


def test_integers_past_64_bits_are_refused():
    raw = b'{"inputs": [{"name": "x", "shape": [1], "datatype": "UINT64", "data": [%d]}]}'
    with pytest.raises(BadRequest, match=r"'x'.*integers"):
        decode_request(raw % 2**64)


def test_response_data_is_flat_and_fp16_serialises():
    output = Tensor("y", "FP16", (2, 2), np.arange(4, dtype=np.float16).reshape(2, 2))
    document = orjson.loads(encode_response(InferenceResponse("m", [output], id="1")))
    assert document["outputs"][0]["data"] == [0.0, 1.0, 2.0, 3.0]
    assert document["outputs"][0]["shape"] == [2, 2]


def test_undecodable_bytes_output_falls_back_to_base64():
    output = Tensor("y", "BYTES", (1,), np.array([b"\xff\xfe"], dtype=object))
    document = orjson.loads(encode_response(InferenceResponse("m", [output], id="1")))
    assert document["outputs"][0]["data"] == ["//4="]
    assert document["outputs"][0]["parameters"]["content_type"] == "base64"


def test_new_request_ids_are_version_4_uuids_and_unique():
    ids = [new_request_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    for text in ids[:500]:
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # the 36-character lower-case form
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_new_request_ids_of_a_forked_child_differ_from_its_parents():
    # Workers are forked: without the reseed in the child, a child and its parent (and two
    # siblings) would draw the same ids from the same generator state.
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids to the parent, then out without cleanup
        os.write(writer, " ".join(new_request_id() for _ in range(3)).encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [new_request_id() for _ in range(3)]
    assert len(child) == 3
    assert not set(child) & set(parent)


def test_seeding_the_random_module_does_not_repeat_request_ids():
    state = random.getstate()
    try:
        random.seed(7)
        first = new_request_id()
        random.seed(7)
        assert new_request_id() != first
    finally:
        random.setstate(state)
