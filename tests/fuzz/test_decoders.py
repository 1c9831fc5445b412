"""Hypothesis against the worker-side decoders: REST JSON, the binary tensor extension and
gRPC ModelInferRequest bytes, built from valid requests then mutated (shapes, datatypes,
sizes, lengths, nesting, raw bytes).

Whatever the body, a decoder returns a request or raises an InferpoolError of status 400
or 413, and never allocates much more than the limits allow (tracemalloc's peak; numpy
reports its buffers to it). The same bodies through the worker path (``run_group``) with a
real model answer 200/400/413, never a 500.
"""

from __future__ import annotations

import json
import struct
import time
import tracemalloc
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from inferpool.engine.ipc.messages import Kind, RequestHeader
from inferpool.engine.worker.model import LoadedModel
from inferpool.engine.worker.path import Job, run_group
from inferpool.errors import InferpoolError
from inferpool.protocol import grpc_wire, limits, rest_wire
from inferpool.protocol.datatypes import DATATYPES
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.settings import ModelSettings

# Small limits, so that the peak check below means something.
LIMITS = limits.DecodeLimits(
    max_tensor_elements=100_000, max_request_tensor_bytes=2 * 1024 * 1024, max_json_depth=16
)
PEAK_BYTES = 24 * 1024 * 1024  # limits, plus the body parsed into Python objects, plus slack
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(autouse=True, scope="module")
def small_limits() -> Iterator[None]:
    before = limits.current()
    limits.configure(LIMITS)
    yield
    limits.configure(before)


def decodes_or_refuses(decode: Callable[[], object]) -> None:
    tracemalloc.start()
    try:
        decode()
    except InferpoolError as exc:
        assert exc.status in (400, 413), (exc.status, exc.message)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"the decoder allocated {peak} bytes"


# -- what a mutated request is made of

INTERESTING_INTS = [0, 1, 3, 4, 2**31 - 1, 2**31, 2**32, 2**53, 2**62, 2**63 - 1, 10**9, 3 * 10**8]
dims = st.one_of(
    st.integers(0, 6),
    st.sampled_from(INTERESTING_INTS),
    st.integers(-(2**63), 2**63 - 1),
)
shapes = st.one_of(
    st.lists(st.integers(0, 4), max_size=3),
    st.lists(st.sampled_from([0, 1, 2, 2**62, 3 * 10**8, 10**12]), max_size=4),  # 0 × huge
    st.lists(dims, max_size=40),
)
datatypes = st.one_of(st.sampled_from(DATATYPES), st.text(max_size=6))
scalars = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(),  # NaN and infinities included: Python's json writes them bare
    st.booleans(),
    st.text(max_size=4),
    st.none(),
)
json_data = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5), max_leaves=40)


def deep(levels: int, inner: object = 1) -> object:
    for _ in range(levels):
        inner = [inner]
    return inner


@st.composite
def tensor_documents(draw) -> dict:
    datatype = draw(datatypes)
    shape = draw(shapes)
    if draw(st.booleans()):
        # Valid data for the declared shape when it is small: mutations start near valid.
        count = int(np.prod(shape)) if shape and all(0 <= d <= 6 for d in shape) else 1
        data: object = [draw(scalars) for _ in range(min(count, 50))]
    else:
        data = draw(st.one_of(json_data, st.integers(1, 200).map(deep)))
    tensor: dict = {
        "name": draw(st.sampled_from(["x", "y", ""])),
        "datatype": datatype,
        "shape": shape,
        "data": data,
    }
    if draw(st.integers(0, 4)) == 0:
        tensor["parameters"] = {"content_type": draw(st.sampled_from(["np", "str", "json", 3]))}
    if draw(st.integers(0, 5)) == 0:
        del tensor[draw(st.sampled_from(["name", "datatype", "shape", "data"]))]
    return tensor


@st.composite
def rest_bodies(draw) -> bytes:
    document: dict = {"inputs": draw(st.lists(tensor_documents(), min_size=0, max_size=3))}
    if draw(st.booleans()):
        document["outputs"] = [{"name": draw(st.text(max_size=3))}]
    if draw(st.integers(0, 3)) == 0:
        document["parameters"] = {"p": deep(draw(st.integers(0, 40)))}
    body = json.dumps(document).encode()
    return draw(mutated(body))


TOKENS = [b"[", b"]", b"{", b"}", b'"', b",", b"NaN", b"-1", b"1e400", b"99999999999999999999"]


@st.composite
def mutated(draw, body: bytes) -> bytes:
    """``body`` with a few bytes replaced, dropped, or interesting tokens inserted."""
    data = bytearray(body)
    for _ in range(draw(st.integers(0, 3))):
        position = draw(st.integers(0, len(data)))
        action = draw(st.integers(0, 3))
        if action == 0 and position < len(data):
            data[position] = draw(st.integers(0, 255))
        elif action == 1:
            del data[position : position + draw(st.integers(1, 8))]
        elif action == 2:
            data[position:position] = draw(st.sampled_from(TOKENS)) * draw(st.integers(1, 300))
        else:
            data = data[:position]
    return bytes(data)


@st.composite
def bytes_elements(draw) -> bytes:
    """BYTES elements as the extension carries them, with lengths that may lie."""
    parts = []
    for item in draw(st.lists(st.binary(max_size=8), max_size=6)):
        length = len(item) if draw(st.booleans()) else draw(st.sampled_from(INTERESTING_INTS))
        parts.append(struct.pack("<I", length % 2**32) + item)
    return b"".join(parts)


@st.composite
def binary_requests(draw) -> tuple[bytes, int | None]:
    """A JSON header whose inputs take their bytes from the tail, and that tail."""
    header_inputs = []
    tail = b""
    for index in range(draw(st.integers(1, 3))):
        datatype = draw(datatypes)
        chunk = draw(st.one_of(bytes_elements(), st.binary(max_size=64)))
        size: object = len(chunk)
        if draw(st.integers(0, 3)) == 0:
            size = draw(st.one_of(st.integers(-5, 2**64), st.text(max_size=2), st.none()))
        header_inputs.append(
            {
                "name": f"i{index}",
                "datatype": datatype,
                "shape": draw(shapes),
                "parameters": {"binary_data_size": size},
            }
        )
        tail += chunk
    header = json.dumps({"inputs": header_inputs}).encode()
    json_length: int | None = len(header)
    if draw(st.integers(0, 4)) == 0:
        json_length = draw(st.one_of(st.integers(-10, len(header) + 100), st.none()))
    return draw(mutated(header + tail)), json_length


PROTOBUF_INT64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def grpc_bodies(draw) -> bytes:
    message = pb.ModelInferRequest(model_name="m", id=draw(st.text(max_size=3)))
    raw = draw(st.booleans())
    for index in range(draw(st.integers(0, 3))):
        shape = draw(
            st.one_of(
                shapes.filter(lambda s: all(-(2**63) <= d < 2**63 for d in s)),
                st.lists(PROTOBUF_INT64, max_size=4),
            )
        )
        tensor = message.inputs.add(
            name=draw(st.sampled_from([f"i{index}", "x", ""])),
            datatype=draw(datatypes),
            shape=shape,
        )
        if raw:
            message.raw_input_contents.append(
                draw(st.one_of(bytes_elements(), st.binary(max_size=64)))
            )
        else:
            field = draw(st.sampled_from(list(grpc_wire.CONTENTS_FIELD.values())))
            values = {
                "bool_contents": st.lists(st.booleans(), max_size=8),
                "int_contents": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8),
                "int64_contents": st.lists(PROTOBUF_INT64, max_size=8),
                "uint_contents": st.lists(st.integers(0, 2**32 - 1), max_size=8),
                "uint64_contents": st.lists(st.integers(0, 2**64 - 1), max_size=8),
                "fp32_contents": st.lists(st.floats(width=32), max_size=8),
                "fp64_contents": st.lists(st.floats(), max_size=8),
                "bytes_contents": st.lists(st.binary(max_size=8), max_size=8),
            }[field]
            getattr(tensor.contents, field).extend(draw(values))
    if draw(st.integers(0, 4)) == 0:
        message.outputs.add(name="y")
    return draw(mutated(message.SerializeToString()))


# -- the properties


def lying_header(datatype: str, shape: list[int], size: int) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": datatype,
                    "shape": shape,
                    "parameters": {"binary_data_size": size},
                }
            ]
        }
    ).encode()


def grpc_raw(datatype: str, shape: list[int], raw: bytes) -> bytes:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=shape)
    return pb.ModelInferRequest(inputs=[tensor], raw_input_contents=[raw]).SerializeToString()


LYING_BYTES = lying_header("BYTES", [3 * 10**8], 8)


@FUZZ
@given(rest_bodies())
@example(b'{"inputs":[{"name":"x","datatype":"FP32","shape":[0,%d],"data":[]}]}' % 2**62)
@example(
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":%s}]}'
    % (b"[" * 5000 + b"NaN" + b"]" * 5000)
)
@example(b'{"inputs":[],"parameters":%s}' % (b"[" * 1000 + b"]" * 1000))
def test_rest_json_decoder_only_refuses_with_400_or_413(body):
    decodes_or_refuses(lambda: rest_wire.decode(body, None))


@FUZZ
@given(binary_requests())
@example((LYING_BYTES + bytes(8), len(LYING_BYTES)))
@example((lying_header("FP32", [0, 2**62], 0), len(lying_header("FP32", [0, 2**62], 0))))
def test_binary_extension_decoder_only_refuses_with_400_or_413(request_parts):
    body, json_length = request_parts
    decodes_or_refuses(lambda: rest_wire.decode(body, json_length))


@FUZZ
@given(grpc_bodies())
@example(grpc_raw("BYTES", [3 * 10**8], bytes(8)))
@example(grpc_raw("FP64", [0, 2**62], b""))
@example(grpc_raw("BYTES", [0, 2**62], b""))
def test_grpc_decoder_only_refuses_with_400_or_413(body):
    decodes_or_refuses(lambda: grpc_wire.decode(body))


@pytest.fixture(scope="module")
def sums_model() -> LoadedModel:
    from inferpool import Runtime

    class Sums(Runtime):
        def load(self) -> None:
            pass

        def predict(self, payload, outputs):
            return {outputs[0]: np.asarray(payload, dtype=float).reshape(len(payload), -1).sum(1)}

    settings = ModelSettings(
        name="sums", outputs=[{"name": "y", "datatype": "FP64", "shape": [-1]}]
    )
    runtime = Sums(settings)
    runtime.load()
    return LoadedModel(settings, runtime)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(
        rest_bodies().map(lambda b: (Kind.REST, b, None)),
        binary_requests().map(lambda r: (Kind.REST, *r)),
        grpc_bodies().map(lambda b: (Kind.GRPC, b, None)),
    )
)
# Found by this test: two inputs of zero rows each (shape [0]) were a 500 from numpy.
@example(
    (
        Kind.GRPC,
        b"\n\x01m*\x0f\n\x02i0\x12\x04BOOL\x1a\x01\x00*\x00*\x0f\n\x02i1\x12\x04BOOL"
        b"\x1a\x01\x00*\x002\x03\n\x01y",
        None,
    )
)
def test_the_worker_answers_hostile_bodies_without_a_server_error(sums_model, case):
    kind, body, json_length = case
    header = RequestHeader(0, 0, kind, json_length, 0, time.monotonic_ns(), len(body))
    (reply,) = run_group(sums_model, [Job(header, body)])
    # 500 would be a fault of the server; this model only fails (as a model, 500
    # "raised") on payloads it cannot sum, which the message says.
    assert reply.status in (200, 400, 413) or reply.body.startswith(b"model 'sums' raised"), (
        reply.status,
        reply.body[:300],
    )
