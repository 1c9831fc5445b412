"""ModelInferRequest bytes → InferenceRequest, and InferenceResponse → ModelInferResponse bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from inferpool.engine.ipc.messages import Kind
from inferpool.engine.worker.wire_formats import wire_format
from inferpool.errors import BadRequest
from inferpool.protocol import grpc_wire
from inferpool.protocol.datatypes import NUMPY_BY_DATATYPE
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.types import InferenceResponse, Tensor
from tests.support.grpc import SAMPLES, TYPED_FIELD


def typed_request(datatype: str, values: np.ndarray, name: str = "x") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name=name, datatype=datatype, shape=values.shape)
    getattr(tensor.contents, TYPED_FIELD[datatype]).extend(values.ravel().tolist())
    return request


def raw_request(datatype: str, values: np.ndarray) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype=datatype, shape=values.shape)
    if datatype == "BYTES":
        raw = b"".join(len(v).to_bytes(4, "little") + v for v in values.ravel())
    else:
        raw = values.astype(values.dtype.newbyteorder("<")).tobytes()
    request.raw_input_contents.append(raw)
    return request


def decode(request: pb.ModelInferRequest):
    return grpc_wire.decode(request.SerializeToString())


def test_registers_itself_as_the_grpc_wire_format():
    assert wire_format(Kind.GRPC) is grpc_wire


@pytest.mark.parametrize("datatype", list(SAMPLES))
@pytest.mark.parametrize("build", [typed_request, raw_request])
def test_every_datatype_decodes_to_its_dtype_and_shape(datatype, build):
    values = SAMPLES[datatype]
    request = decode(build(datatype, values))
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, (2, 2))
    assert tensor.data.dtype == NUMPY_BY_DATATYPE[datatype]
    assert tensor.data.shape == (2, 2)
    assert np.array_equal(tensor.data, values)
    assert request.raw_contents is (build is raw_request)


def test_a_raw_batch_is_a_view_of_the_bytes_not_lists():
    batch = np.random.default_rng(0).random((256, 50), dtype=np.float32)
    (tensor,) = decode(raw_request("FP32", batch)).inputs
    assert not tensor.data.flags.owndata, "raw contents must be np.frombuffer views"
    root = tensor.data
    while isinstance(root, np.ndarray):
        root = root.base
    assert isinstance(root, bytes), "the view's memory is the request's bytes"
    assert np.array_equal(tensor.data, batch)


def test_request_fields_carry_over():
    request = typed_request("INT64", np.array([1, 2]))
    request.id = "abc"
    request.parameters["content_type"].string_param = "np"
    request.parameters["flag"].bool_param = True
    request.inputs[0].parameters["scale"].double_param = 0.5
    request.outputs.add(name="predict_proba").parameters["n"].int64_param = 3
    decoded = decode(request)
    assert decoded.id == "abc"
    assert decoded.parameters == {"content_type": "np", "flag": True}
    assert decoded.inputs[0].parameters == {"scale": 0.5}
    assert [(o.name, o.parameters) for o in decoded.outputs] == [("predict_proba", {"n": 3})]


def bad(request: pb.ModelInferRequest | bytes, message: str) -> None:
    body = request if isinstance(request, bytes) else request.SerializeToString()
    with pytest.raises(BadRequest) as caught:
        grpc_wire.decode(body)
    assert message in caught.value.message


# cast_checked casts FP32 → FP16 first and then refuses the infinities it produced.
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_malformed_requests_are_bad_requests():
    bad(b"\x0a\xff", "not a valid inference.ModelInferRequest")
    bad(pb.ModelInferRequest(model_name="m"), "at least one input")
    bad(typed_request("INT8", np.array([1, 300])), "out of range for INT8")
    bad(typed_request("UINT16", np.array([70000], np.uint32)), "out of range for UINT16")
    bad(typed_request("FP16", np.array([1e6], np.float32)), "out of range for FP16")

    wrong_count = typed_request("FP32", np.array([1.0, 2.0], np.float32))
    wrong_count.inputs[0].shape[:] = [3]
    bad(wrong_count, "input 'x': shape [3] needs 3 values, got 2")

    wrong_field = typed_request("FP32", np.array([1.0], np.float32))
    wrong_field.inputs[0].datatype = "INT32"
    bad(wrong_field, "INT32 data belongs in int_contents, not fp32_contents")

    negative = typed_request("FP32", np.array([1.0], np.float32))
    negative.inputs[0].shape[:] = [-1]
    bad(negative, "shape must be a list of non-negative integers")

    unnamed = typed_request("FP32", np.array([1.0], np.float32), name="")
    bad(unnamed, "must have a name")


def test_malformed_raw_contents_are_bad_requests():
    short = raw_request("FP64", np.array([1.0, 2.0]))
    short.raw_input_contents[0] = short.raw_input_contents[0][:-1]
    bad(short, "input 'x': shape [2] of FP64 needs 16 bytes, got 15")

    truncated = raw_request("BYTES", np.array([b"abc"], dtype=object))
    truncated.raw_input_contents[0] = truncated.raw_input_contents[0][:-1]
    bad(truncated, "BYTES element 0 runs past the data")

    both = raw_request("INT32", np.array([1], np.int32))
    both.inputs[0].contents.int_contents.append(1)
    bad(both, "input 'x' has both contents and raw_input_contents")

    mixed = raw_request("INT32", np.array([1], np.int32))
    mixed.inputs.add(name="y", datatype="INT32", shape=[1]).contents.int_contents.append(2)
    bad(mixed, "raw_input_contents has 1 entries for 2 inputs")


def response_of(*outputs: Tensor) -> InferenceResponse:
    return InferenceResponse("m", list(outputs), model_version="2", id="r")


def encode(response: InferenceResponse, raw: bool) -> pb.ModelInferResponse:
    request = grpc_wire.GrpcInferenceRequest(inputs=[], raw_contents=raw)
    body, json_length = grpc_wire.encode(response, request)
    assert json_length is None
    return pb.ModelInferResponse.FromString(body)


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_every_datatype_encodes_typed_and_raw(datatype):
    values = SAMPLES[datatype]
    response = response_of(Tensor("y", datatype, values.shape, values))

    typed = encode(response, raw=False)
    (output,) = typed.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("y", datatype, [2, 2])
    assert list(getattr(output.contents, TYPED_FIELD[datatype])) == values.ravel().tolist()
    assert not typed.raw_output_contents

    raw = encode(response, raw=True)
    assert not raw.outputs[0].HasField("contents")
    assert raw.raw_output_contents[0] == raw_request(datatype, values).raw_input_contents[0]


def test_string_outputs_travel_as_utf8():
    words = np.array(["héllo", "日本"], dtype=object)
    response = response_of(Tensor("y", "BYTES", (2,), words))
    assert list(encode(response, raw=False).outputs[0].contents.bytes_contents) == [
        "héllo".encode(),
        "日本".encode(),
    ]
    expected = b"".join(len(w.encode()).to_bytes(4, "little") + w.encode() for w in words)
    assert encode(response, raw=True).raw_output_contents[0] == expected


def test_response_fields_and_parameters():
    tensor = Tensor("y", "FP64", (1,), np.array([1.0]), {"content_type": "np"})
    response = response_of(tensor)
    response.parameters = {"b": True, "i": -3, "u": 2**64 - 1, "f": 0.25, "s": "x", "d": {"k": 1}}
    message = encode(response, raw=False)
    assert (message.model_name, message.model_version, message.id) == ("m", "2", "r")
    assert grpc_wire.parameters_dict(message.parameters) == {
        "b": True,
        "i": -3,
        "u": 2**64 - 1,
        "f": 0.25,
        "s": "x",
        "d": '{"k":1}',
    }
    assert message.outputs[0].parameters["content_type"].string_param == "np"


NUMERIC = [name for name in SAMPLES if name not in ("BYTES", "BOOL")]


@given(
    st.sampled_from(NUMERIC).flatmap(
        lambda name: st.tuples(
            st.just(name),
            hnp.arrays(
                NUMPY_BY_DATATYPE[name], hnp.array_shapes(min_dims=1, max_dims=3, max_side=4)
            ),
        )
    )
)
def test_raw_round_trip_is_exact(case):
    datatype, values = case
    (tensor,) = decode(raw_request(datatype, values)).inputs
    assert tensor.data.tobytes() == values.tobytes()
    response = encode(response_of(Tensor("y", datatype, values.shape, tensor.data)), raw=True)
    assert response.raw_output_contents[0] == values.tobytes()
