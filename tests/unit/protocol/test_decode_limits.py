"""Decode limits: every wire path checks a request's declared shapes against the limits and
the bytes present before allocating, and refuses deep JSON with a 400 (issue 12)."""

from __future__ import annotations

import struct
import sys
import tracemalloc
from collections.abc import Callable, Iterator

import numpy as np
import orjson
import pytest

from inferpool.codecs.json import JsonCodec
from inferpool.errors import BadRequest, InferpoolError, TooLarge
from inferpool.protocol import grpc_wire, limits, rest_wire
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.types import Tensor

LIE = 5 * 10**6  # BYTES elements a tiny request declares (within every default limit)


@pytest.fixture
def small_limits() -> Iterator[limits.DecodeLimits]:
    """Limits small enough to reach with tiny requests; the defaults come back after."""
    before = limits.current()
    small = limits.DecodeLimits(
        max_tensor_elements=1000, max_request_tensor_bytes=4000, max_json_depth=8
    )
    limits.configure(small)
    yield small
    limits.configure(before)


def binary_body(datatype: str, shape: list, tail: bytes) -> tuple[bytes, int]:
    """A REST body with one input in the binary extension: (body, JSON length)."""
    header = b'{"inputs":[{"name":"x","datatype":"%s","shape":[%s],' % (
        datatype.encode(),
        ",".join(str(d) for d in shape).encode(),
    ) + b'"parameters":{"binary_data_size":%d}}]}' % len(tail)
    return header + tail, len(header)


def grpc_body(datatype: str, shape: list, raw: bytes | None = None, **contents) -> bytes:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=shape)
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    message = pb.ModelInferRequest(model_name="m", inputs=[tensor])
    if raw is not None:
        message.raw_input_contents.append(raw)
    return message.SerializeToString()


def json_body(datatype: str, shape: list, data: object) -> bytes:
    return orjson.dumps(
        {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]}
    )


def refused(decode: Callable[[], object], status: int = 400, peak_bytes: int = 1 << 20) -> str:
    """The message of the error ``decode`` raises, having allocated less than ``peak_bytes``."""
    tracemalloc.start()
    try:
        with pytest.raises(InferpoolError) as caught:
            decode()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.status == status, caught.value.message
    assert peak < peak_bytes, f"allocated {peak} bytes before refusing"
    return caught.value.message


# -- the 114-byte lie: a BYTES count far above what the bytes present can hold


def test_lying_bytes_count_in_the_binary_extension_is_400_before_allocating():
    body, json_length = binary_body("BYTES", [LIE], struct.pack("<I", 1) + b"a")
    assert len(body) < 130
    message = refused(lambda: rest_wire.decode(body, json_length))
    assert "input 'x'" in message and f"declares {LIE} BYTES elements" in message


def test_lying_bytes_count_in_grpc_raw_contents_is_400_before_allocating():
    body = grpc_body("BYTES", [LIE], raw=struct.pack("<I", 1) + b"a")
    message = refused(lambda: grpc_wire.decode(body))
    assert "input 'x'" in message and "at most 1" in message


def test_lying_bytes_count_in_grpc_typed_contents_allocates_only_what_is_sent():
    # MLServer takes string contents whatever their shape says (its clients send one
    # string with its length as shape): the strings sent, flat; nothing for the lie.
    body = grpc_body("BYTES", [LIE], bytes_contents=[b"a"])
    tracemalloc.start()
    try:
        request = grpc_wire.decode(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (tensor,) = request.inputs
    assert tensor.shape == (1,) and tensor.data.tolist() == [b"a"]
    assert peak < 1 << 20, f"allocated {peak} bytes for one string"


def test_lying_numeric_count_in_grpc_typed_contents_is_400():
    body = grpc_body("FP32", [LIE], fp32_contents=[1.0])
    assert "needs 5000000 values, got 1" in refused(lambda: grpc_wire.decode(body))


@pytest.mark.parametrize("count", [10**9, 10**12, 2**62, 2**124])
@pytest.mark.parametrize("path", ["json", "binary", "grpc-raw", "grpc-typed"])
def test_huge_declared_shapes_are_400_naming_the_limit(path, count):
    grpc_shape = [count] if count < 2**63 else [2**62, 2**62]
    decoders = {
        "json": lambda: rest_wire.decode(
            b'{"inputs":[{"name":"x","datatype":"BYTES","shape":[%d],"data":["a"]}]}' % count, None
        ),
        "binary": lambda: rest_wire.decode(*binary_body("BYTES", [count], b"\0" * 8)),
        "grpc-raw": lambda: grpc_wire.decode(grpc_body("BYTES", grpc_shape, raw=b"\0" * 8)),
        "grpc-typed": lambda: grpc_wire.decode(grpc_body("FP32", grpc_shape, fp32_contents=[1.0])),
    }
    message = refused(decoders[path])
    assert "input 'x'" in message
    if count < 2**63:  # orjson reads a larger integer as a float: not a valid shape
        assert "max_tensor_elements" in message


@pytest.mark.parametrize(
    "shape, detail",
    [
        ([0, 2**62], "max_tensor_elements"),  # no elements, but no array could have the shape
        ([1] * 33, "33 dimensions"),
        ([-1, 4], "non-negative"),
    ],
)
def test_impossible_shapes_are_400(shape, detail):
    body = json_body("FP32", shape, [])
    assert detail in refused(lambda: rest_wire.decode(body, None))
    grpc = grpc_body("FP32", shape)
    assert detail in refused(lambda: grpc_wire.decode(grpc))


def test_element_limit_is_the_configured_one_on_every_path(small_limits):
    ones = np.ones(1001, dtype="<f4")
    for decode in (
        lambda: rest_wire.decode(json_body("FP32", [1001], ones.tolist()), None),
        lambda: rest_wire.decode(*binary_body("FP32", [1001], ones.tobytes())),
        lambda: grpc_wire.decode(grpc_body("FP32", [1001], raw=ones.tobytes())),
        lambda: grpc_wire.decode(grpc_body("FP32", [1001], fp32_contents=ones.tolist())),
    ):
        message = refused(decode)
        assert message.endswith("over the limit of 1000 (max_tensor_elements)")
    # At the limit, every path decodes.
    assert rest_wire.decode(json_body("FP32", [1000], ones[:1000].tolist()), None)


def test_bytes_summed_over_the_request_are_413_naming_the_limit(small_limits):
    # 400 FP64 values (3200 bytes) fit alone; a second such input passes 4000 bytes.
    one = {"name": "a", "datatype": "FP64", "shape": [400], "data": [0.0] * 400}
    body = orjson.dumps({"inputs": [one, {**one, "name": "b"}]})
    message = refused(lambda: rest_wire.decode(body, None), status=413)
    assert "input 'b'" in message and "max_request_tensor_bytes" in message
    with pytest.raises(TooLarge):
        rest_wire.decode(body, None)
    tensors = [
        pb.ModelInferRequest.InferInputTensor(name=name, datatype="FP64", shape=[400])
        for name in "ab"
    ]
    grpc = pb.ModelInferRequest(
        inputs=tensors, raw_input_contents=[bytes(3200), bytes(3200)]
    ).SerializeToString()
    assert "input 'b'" in refused(lambda: grpc_wire.decode(grpc), status=413)
    # One of them alone decodes.
    assert rest_wire.decode(orjson.dumps({"inputs": [one]}), None).inputs[0].data.size == 400


# -- JSON nesting depth


def nested(levels: int, inner: bytes = b"1") -> bytes:
    return b"[" * levels + inner + b"]" * levels


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":%s}]}' % nested(5000),
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":%s}]}'
        % nested(5000, b"NaN"),  # parsed by the standard library (bare NaN)
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":%s}]}'
        % nested(200_000, b"NaN"),
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":%s}]}' % nested(62),
        b'{"inputs":[{"name":"x","datatype":"BYTES","shape":[1],"data":%s}]}' % nested(70, b'"a"'),
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],'
        b'"parameters":{"p":%s}}' % nested(70),
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],'
        b'"parameters":{"p":%s}}]}' % nested(62),
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],'
        b'"outputs":[{"name":"y","parameters":{"p":%s}}]}' % nested(62),
        b'{"junk":%s,"inputs":[]}' % nested(64),
    ],
    ids=[
        "5000",
        "5000-nan",
        "200000-nan",
        "data-62",
        "bytes-70",
        "request-parameters",
        "input-parameters",
        "output-parameters",
        "unknown-key",
    ],
)
def test_deep_json_is_400_never_a_recursion_error(body):
    message = refused(lambda: rest_wire.decode(body, None), peak_bytes=64 << 20)
    assert "depth" in message or "nested deeper" in message


def test_json_depth_is_the_configured_one(small_limits):
    shallow = (
        b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],"parameters":{"p":%s}}'
    )
    assert rest_wire.decode(shallow % nested(6), None).parameters["p"]
    assert "(max_json_depth)" in refused(lambda: rest_wire.decode(shallow % nested(7), None))
    data = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":%s}]}'
    assert rest_wire.decode(data % nested(5), None).inputs[0].data.shape == (1,)
    assert "(max_json_depth)" in refused(lambda: rest_wire.decode(data % nested(6), None))


def test_json_codec_refuses_deep_documents(small_limits):
    def tensor(document: bytes) -> Tensor:
        data = np.empty(1, dtype=object)
        data[0] = document
        return Tensor("doc", "BYTES", (1,), data, {"content_type": "json"})

    assert JsonCodec.decode(tensor(b'{"a":' + nested(6) + b"}")) == [{"a": [[[[[[1]]]]]]}]
    with pytest.raises(BadRequest, match="input 'doc': element 0 is not valid JSON"):
        JsonCodec.decode(tensor(b'{"a":' + nested(8) + b"}"))
    with pytest.raises(BadRequest, match="input 'doc'"):
        JsonCodec.decode(tensor(nested(100_000)))


def test_depth_check_never_recurses_past_the_limit():
    # A document at orjson's own limit (1024) is walked at most max_json_depth levels.
    body = b'{"inputs":[],"parameters":%s}' % nested(1000)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        assert "(max_json_depth)" in refused(lambda: rest_wire.decode(body, None))
    finally:
        sys.setrecursionlimit(limit)


def test_binary_data_size_without_binary_data_is_400():
    # The input's data would otherwise be an empty placeholder of the declared shape.
    header, _ = binary_body("FP32", [1000], b"")
    message = refused(lambda: rest_wire.decode(header, None))
    assert message.startswith("input 'x' has binary_data_size, but the request has no binary")


def test_bytes_elements_count_what_their_objects_cost(small_limits):
    # Each BYTES element costs its pointer and a bytes object (41 bytes), not its 4-byte
    # length prefix: 97 fit in 4000 bytes, 100 do not.
    def elements(count: int) -> bytes:
        return (struct.pack("<I", 1) + b"a") * count

    assert rest_wire.decode(*binary_body("BYTES", [97], elements(97))).inputs[0].data.size == 97
    message = refused(lambda: rest_wire.decode(*binary_body("BYTES", [100], elements(100))), 413)
    assert "max_request_tensor_bytes" in message
    body = grpc_body("BYTES", [100], raw=elements(100))
    assert "max_request_tensor_bytes" in refused(lambda: grpc_wire.decode(body), 413)
