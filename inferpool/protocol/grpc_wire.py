"""The gRPC wire format: ModelInferRequest bytes to an InferenceRequest, a response to bytes.

Runs where tensors are handled (a worker, or the frontend with ``workers=0``);
``engine/worker/wire_formats.py`` maps ``Kind.GRPC`` to this module (a ``WireFormat``).
Inputs arrive either as typed ``contents``
or, for every input at once, as ``raw_input_contents`` (little-endian, row-major; BYTES
elements each prefixed by a 4-byte little-endian length). Raw inputs become zero-copy
``np.frombuffer`` views, never Python lists; the response answers in the form the
request used.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from google.protobuf.message import DecodeError

from inferpool.errors import BadRequest
from inferpool.protocol import limits
from inferpool.protocol.binary import bytes_elements_to_wire, tensor_from_bytes, tensor_to_bytes
from inferpool.protocol.datatypes import (
    NUMPY_BY_DATATYPE,
    admit,
    cast_checked,
    check_shape,
    element_count,
    numpy_dtype,
)
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.protowire import split_field
from inferpool.protocol.shared_memory import REGION, placeholder
from inferpool.protocol.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

# The typed ``contents`` field of each datatype. FP16 has none in the specification;
# like MLServer we accept and answer it in fp32_contents (raw contents carry it exactly).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP16": "fp32_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# The numpy dtype of each repeated field's protobuf type.
_FIELD_DTYPE = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
}
# Packed float and double fields are little-endian arrays on the wire, so typed float
# outputs are built from the array's bytes rather than a Python list: (field, dtype).
_PACKED_FLOATS = {"fp32_contents": (6, "<f4"), "fp64_contents": (7, "<f8")}
_INT64_MAX = 2**63 - 1


@dataclass(slots=True)
class GrpcInferenceRequest(InferenceRequest):
    """A request that remembers whether its inputs came as raw contents."""

    raw_contents: bool = False


# ModelInferRequest's raw_input_contents: its field number.
_RAW_INPUT = 7


def decode(body: bytes, json_length: int | None = None) -> GrpcInferenceRequest:
    """Parse a serialized ModelInferRequest; every problem is a 400 naming the input.
    A body of ``LARGE_RAW`` bytes or more has its raw contents read in place (views of
    ``body``): the parse copies only the rest."""
    raw: Any
    try:
        if len(body) >= LARGE_RAW:
            rest, raw = split_field(body, _RAW_INPUT)
            message = pb.ModelInferRequest.FromString(rest)
        else:
            message = pb.ModelInferRequest.FromString(body)
            raw = message.raw_input_contents
    except (DecodeError, ValueError):
        raise BadRequest("request body is not a valid inference.ModelInferRequest") from None
    if not message.inputs:
        raise BadRequest("request must have at least one input")
    if raw and len(raw) != len(message.inputs):
        raw = _raw_beside_regions(message.inputs, raw)
    current = limits.current()
    spent = 0  # bytes the request's tensors decode to, checked before each one is built
    inputs = []
    for index, tensor in enumerate(message.inputs):
        tensor_data, spent = decode_input(tensor, raw[index] if raw else None, spent, current)
        inputs.append(tensor_data)
    return GrpcInferenceRequest(
        inputs=inputs,
        id=message.id or None,
        outputs=[RequestedOutput(o.name, parameters_dict(o.parameters)) for o in message.outputs],
        parameters=parameters_dict(message.parameters),
        raw_contents=bool(raw),
    )


def _raw_beside_regions(inputs: Any, raw: Any) -> list[bytes | None]:
    """Each input's raw contents when the inputs in shared-memory regions have none (as
    tritonclient sends them: one entry per other input); else the count is a 400."""
    in_region = [REGION in tensor.parameters for tensor in inputs]
    if len(raw) != in_region.count(False):
        raise BadRequest(
            f"raw_input_contents has {len(raw)} entries for {len(inputs)} inputs; "
            "send every input raw, or none"
        )
    entries = iter(raw)
    return [None if region else next(entries) for region in in_region]


def response_from_message(message: Any) -> InferenceResponse:
    """A ModelInferResponse message as the typed struct (its outputs decoded as inputs
    are: typed contents or raw_output_contents); a 400 names a bad output."""
    raw = message.raw_output_contents
    if raw and len(raw) != len(message.outputs):
        raise BadRequest(
            f"raw_output_contents has {len(raw)} entries for {len(message.outputs)} outputs"
        )
    current = limits.current()
    spent = 0
    outputs = []
    for index, tensor in enumerate(message.outputs):
        output, spent = decode_input(tensor, raw[index] if raw else None, spent, current)
        outputs.append(output)
    return response_of(message, outputs)


def response_of(message: Any, outputs: list[Tensor]) -> InferenceResponse:
    """A ModelInferResponse message's own fields around its decoded ``outputs``."""
    return InferenceResponse(
        model_name=message.model_name,
        outputs=outputs,
        model_version=message.model_version or None,
        id=message.id or None,
        parameters=parameters_dict(message.parameters),
    )


def decode_input(
    tensor: Any, raw: bytes | None, spent: int = 0, current: limits.DecodeLimits | None = None
) -> tuple[Tensor, int]:
    """One InferInputTensor, its data from ``raw`` bytes when given, else its contents;
    and the bytes the request's tensors decode to so far (``spent`` plus this one's)."""
    name = tensor.name
    if not name:
        raise BadRequest("every input must have a name")
    datatype = tensor.datatype
    numpy_dtype(datatype, name)
    shape = check_shape(list(tensor.shape), name)
    _, spent = admit(name, datatype, shape, spent, current or limits.current())
    parameters = parameters_dict(tensor.parameters)
    if REGION in parameters:  # filled from a registered region (engine/worker/shm_wire.py)
        return placeholder(name, datatype, shape, parameters), spent
    if raw is None:
        data = typed_data(tensor.contents, datatype, shape, name)
    elif tensor.contents.ListFields():
        raise BadRequest(f"input '{name}' has both contents and raw_input_contents")
    else:
        data = tensor_from_bytes(raw, datatype, shape, name)
    if datatype == "BYTES":
        shape = data.shape  # the data's own shape when it is loose (typed_data)
    return Tensor(name, datatype, shape, data, parameters), spent


def typed_data(contents: Any, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    """The datatype's ``contents`` field as an ndarray of that datatype, shaped as declared
    (BYTES whose count is not the shape's stay flat, as MLServer takes them)."""
    field = CONTENTS_FIELD[datatype]
    for other, _ in contents.ListFields():
        if other.name != field:
            raise BadRequest(
                f"input '{name}': {datatype} data belongs in {field}, not {other.name}"
            )
    values = getattr(contents, field)
    expected = element_count(shape)
    if datatype == "BYTES" and len(values) != expected:
        data = np.empty(len(values), dtype=object)  # flat: MLServer's loose string shapes
        data[:] = list(values)
        return data
    if len(values) != expected:
        raise BadRequest(
            f"input '{name}': shape {list(shape)} needs {expected} values, got {len(values)}"
        )
    if datatype == "BYTES":
        data = np.empty(expected, dtype=object)
        data[:] = list(values)
    else:
        source = np.array(values, dtype=_FIELD_DTYPE[field])  # protobuf 7: __array__, no loop
        data = cast_checked(source, datatype, name)
    return data.reshape(shape)


# ModelInferResponse's raw_output_contents (field 6, length-delimited): its key.
_RAW_OUTPUT_KEY = bytes((6 << 3 | 2,))
# Raw outputs of this many bytes or more (all together) are written after the serialized
# message from the arrays' buffers (one copy, in the join), not copied into the message
# then serialized (three); smaller ones go through the message as they always did.
LARGE_RAW = 1 << 20


def encode(
    response: InferenceResponse, request: InferenceRequest, prefix: bytes = b""
) -> tuple[bytes, None]:
    """A serialized ModelInferResponse: raw contents if the request was raw, else typed;
    ``prefix`` (a headers block) in front."""
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version or "",
        id=response.id or "",
    )
    set_parameters(message.parameters, response.parameters)
    raw = getattr(request, "raw_contents", False)
    large = raw and sum(getattr(out.data, "nbytes", 0) for out in response.outputs) >= LARGE_RAW
    for output in response.outputs:
        tensor = message.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        set_parameters(tensor.parameters, output.parameters)
        if large:
            continue
        if raw:
            message.raw_output_contents.append(raw_bytes(output))
        else:
            fill_contents(tensor.contents, output)
    if large:  # a message's fields may come in any order: the raw contents follow the rest
        parts: list[bytes | memoryview] = [prefix, message.SerializeToString()]
        for output in response.outputs:
            data = tensor_to_bytes(output)
            parts += [_RAW_OUTPUT_KEY, _varint_bytes(len(data)), data]
        return b"".join(parts), None
    body = message.SerializeToString()
    return (prefix + body if prefix else body), None


def raw_bytes(tensor: Tensor) -> bytes:
    """A tensor's data as raw contents: little-endian, row-major, BYTES length-prefixed."""
    if tensor.datatype == "BYTES":
        return bytes_elements_to_wire(tensor.data)
    dtype = NUMPY_BY_DATATYPE[tensor.datatype].newbyteorder("<")
    return np.ascontiguousarray(tensor.data, dtype=dtype).tobytes()


def fill_contents(contents: Any, tensor: Tensor) -> None:
    """A tensor's data into the typed ``contents`` field of its datatype."""
    field = CONTENTS_FIELD[tensor.datatype]
    flat = np.asarray(tensor.data).reshape(-1)
    packed = _PACKED_FLOATS.get(field)
    if packed is not None:
        number, dtype = packed
        raw = np.ascontiguousarray(flat, dtype=dtype).tobytes()
        contents.MergeFromString(_varint_bytes(number << 3 | 2) + _varint_bytes(len(raw)) + raw)
        return
    if tensor.datatype == "BYTES":
        values: list[Any] = [
            item if isinstance(item, bytes) else str(item).encode() for item in flat.tolist()
        ]
    else:
        values = flat.astype(_FIELD_DTYPE[field], copy=False).tolist()
    getattr(contents, field).extend(values)


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def parameters_dict(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as a plain dict."""
    out = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        out[key] = getattr(parameter, choice) if choice else None
    return out


def set_parameters(target: MutableMapping[str, Any], parameters: Mapping[str, Any]) -> None:
    """Fill a ``map<string, InferParameter>``; values with no scalar type travel as JSON."""
    for key, value in parameters.items():
        parameter = target[key]
        if isinstance(value, bool | np.bool_):
            parameter.bool_param = bool(value)
        elif isinstance(value, int | np.integer):
            if value > _INT64_MAX:
                parameter.uint64_param = int(value)
            else:
                parameter.int64_param = int(value)
        elif isinstance(value, float | np.floating):
            parameter.double_param = float(value)
        elif isinstance(value, str):
            parameter.string_param = value
        elif value is not None:
            parameter.string_param = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
