"""The REST wire format: a V2 JSON request body to an InferenceRequest, a response to JSON bytes.

Runs where the tensors are handled (a worker, or the frontend with ``workers=0``).
Numeric data goes JSON → numpy in one vectorised step (orjson, then ``np.asarray``), and
numpy → JSON with orjson's native numpy serialisation: no Python loop per element. A
request body's large numeric arrays skip the Python list altogether when the JSON tensor
scanner is built: it reads them straight into numpy buffers (``json_scan``), with the
outcome of the path above, errors included.
"""

from __future__ import annotations

import base64
import json
import os
import random
from typing import Any

import numpy as np
import orjson

from inferpool.errors import BadRequest
from inferpool.protocol import json_scan, limits
from inferpool.protocol.datatypes import (
    admit,
    cast_checked,
    check_shape,
    element_count,
    numpy_dtype,
)
from inferpool.protocol.shared_memory import REGION, placeholder
from inferpool.protocol.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

_DUMP_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


# The levels of a request document above a tensor's data: {"inputs": [{"data": ...}]}.
_DATA_DEPTH = 3
# The most dimensions an ndarray has: 64 on numpy 2, 32 on numpy 1 (which the workers of a
# per-model environment may run: alibi-detect requires numpy<2).
NUMPY_MAX_DIMS = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32


def parse_json_object(body: bytes, what: str = "request body") -> dict[str, Any]:
    """A JSON object, nested no deeper than ``max_json_depth`` (a tensor's ``data`` is
    checked by its decoder instead: numpy bounds its dimensions); anything else is a 400.

    orjson refuses documents deeper than 1024 levels on its own; the walk below only
    looks at containers outside tensor data, so it costs microseconds on any body.
    """
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        document = _loads_with_constants(body, exc, what)
    return check_document(document, what)


def check_document(document: Any, what: str) -> dict[str, Any]:
    """A parsed document as a JSON object within ``max_json_depth``; else a 400."""
    if not isinstance(document, dict):
        raise BadRequest(f"{what} must be a JSON object")
    depth = limits.current().max_json_depth
    for key, value in document.items():
        if type(value) is list and (key == "inputs" or key == "outputs"):
            for tensor in value:
                if type(tensor) is dict:
                    _check_tensor_depth(tensor, depth, what)
                elif type(tensor) is list:
                    check_depth(tensor, depth - 2, what)
        elif type(value) is dict or type(value) is list:
            check_depth(value, depth - 1, what)
    return document


def _check_tensor_depth(tensor: dict[str, Any], depth: int, what: str) -> None:
    for key, value in tensor.items():
        if key != "data" and (type(value) is dict or type(value) is list):
            check_depth(value, depth - _DATA_DEPTH, what)


def check_depth(value: Any, levels: int, what: str) -> None:
    """A 400 when the lists and objects in ``value`` nest more than ``levels`` deep."""
    if nested_deeper(value, levels):
        raise BadRequest(
            f"{what} is nested deeper than the limit of {limits.current().max_json_depth} "
            "(max_json_depth)"
        )


def nested_deeper(value: Any, levels: int) -> bool:
    """Whether the lists and objects in a list or object nest more than ``levels`` deep."""
    # Recursion is bounded by ``levels`` (the limit), never by the document.
    if levels <= 0:
        return True
    for item in value.values() if type(value) is dict else value:
        if (type(item) is dict or type(item) is list) and nested_deeper(item, levels - 1):
            return True
    return False


def _loads_with_constants(body: bytes, error: Exception, what: str) -> Any:
    """Python's json (what MLServer and tritonclient write) puts NaN and Infinity as bare
    literals, which orjson refuses: parse those bodies with the standard library."""
    if b"NaN" not in body and b"Infinity" not in body:
        raise BadRequest(f"{what} is not valid JSON: {error}") from None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: the standard library's parser recurses once per level.
        raise BadRequest(f"{what} is not valid JSON: {error}") from None


def decode_request(body: bytes) -> InferenceRequest:
    """Parse a V2 JSON inference request; every problem is a 400 naming the input."""
    scanned = json_scan.scan(body, limits.current(), limits.current().max_json_depth - _DATA_DEPTH)
    if scanned is not None:
        request = _decode_scanned(*scanned)
        if request is not None:
            return request
    document = parse_json_object(body)
    return request_from_document(document, binary_tail=None)


def _decode_scanned(
    skeleton: bytes, found: dict[int, json_scan.ScannedData]
) -> InferenceRequest | None:
    """The request from a body whose numeric data arrays the scanner read (json_scan says
    why it is the whole body's); None to decode the whole body instead."""
    try:
        document = orjson.loads(skeleton)
    except orjson.JSONDecodeError:
        return None  # the body's own error, or its NaN/Infinity literals: parse it all
    inputs = document.get("inputs") if type(document) is dict else None
    if type(inputs) is not list:
        return None
    for index, data in found.items():
        # The scanner found each array at inputs[index].data, where it left a 0.
        tensor = inputs[index] if index < len(inputs) else None
        if type(tensor) is not dict or tensor.get("data") != 0:
            return None
        tensor["data"] = data
    check_document(document, "request body")
    try:
        return request_from_document(document, binary_tail=None)
    except json_scan.StaleScan:
        return None


def request_from_document(
    document: dict[str, Any], binary_tail: memoryview | None
) -> InferenceRequest:
    """Build a request from its parsed JSON; ``binary_tail`` holds Triton binary tensors."""
    raw_inputs = document.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("request must have a non-empty 'inputs' list")
    current = limits.current()
    spent = 0  # bytes the request's tensors decode to, checked before each one is built
    inputs = []
    for index, raw in enumerate(raw_inputs):
        name, datatype, shape, parameters = tensor_header(raw, index)
        _, spent = admit(name, datatype, shape, spent, current)
        inputs.append(_tensor(raw, name, datatype, shape, parameters))
    if binary_tail is not None:
        from inferpool.protocol.binary import attach_binary_tensors

        attach_binary_tensors(inputs, binary_tail)
    else:
        for tensor in inputs:
            if "binary_data_size" in tensor.parameters:
                raise BadRequest(
                    f"input '{tensor.name}' has binary_data_size, but the request has no "
                    "binary data (no Inference-Header-Content-Length)"
                )
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest("request 'id' must be a string")
    return InferenceRequest(
        inputs=inputs,
        id=request_id,
        outputs=_decode_outputs(document.get("outputs")),
        parameters=_parameters(document.get("parameters"), "request"),
        json_strings=True,
    )


def _parameters(raw: object, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadRequest(f"{where} 'parameters' must be an object")
    return raw


def _decode_outputs(raw: object) -> list[RequestedOutput]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("request 'outputs' must be a list")
    outputs = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise BadRequest("each requested output must be an object with a 'name'")
        outputs.append(RequestedOutput(item["name"], _parameters(item.get("parameters"), "output")))
    return outputs


def tensor_from_document(raw: object, index: int, what: str = "input") -> Tensor:
    """One tensor of a request (or response) document; a 400 names it and the problem."""
    name, datatype, shape, parameters = tensor_header(raw, index, what)
    admit(name, datatype, shape, 0, limits.current())
    assert isinstance(raw, dict)  # tensor_header checked it
    return _tensor(raw, name, datatype, shape, parameters, what)


def tensor_header(
    raw: object, index: int, what: str = "input"
) -> tuple[str, str, tuple[int, ...], dict[str, Any]]:
    """A tensor's name, datatype, shape and parameters, checked (its data is not read)."""
    if not isinstance(raw, dict):
        raise BadRequest(f"{what} {index} must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{what} {index} must have a 'name'")
    datatype: Any = raw.get("datatype")
    numpy_dtype(datatype, name)  # a 400 unless it is a known datatype name
    shape = check_shape(raw.get("shape"), name)
    return name, datatype, shape, _parameters(raw.get("parameters"), f"{what} '{name}'")


def _tensor(
    raw: dict[str, Any],
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    parameters: dict[str, Any],
    what: str = "input",
) -> Tensor:
    """The tensor with its data, once its declared size was admitted."""
    if "binary_data_size" in parameters:
        # Filled in from the binary tail by attach_binary_tensors.
        return Tensor(name, datatype, shape, np.empty(0), parameters)
    if REGION in parameters:  # filled from a registered region (engine/worker/shm_wire.py)
        return placeholder(name, datatype, shape, parameters)
    if "data" not in raw:
        raise BadRequest(f"{what} '{name}' has no 'data'")
    raw_data = raw["data"]
    if type(raw_data) is json_scan.ScannedData:
        data = json_scan.values_for(raw_data, datatype, shape, element_count(shape), name)
    else:
        data = tensor_data_from_json(raw_data, datatype, shape, name)
        shape = data.shape  # loose BYTES keep the data's own shape (below)
    return Tensor(name, datatype, shape, data, parameters)


def tensor_data_from_json(
    data: object, datatype: str, shape: tuple[int, ...], name: str
) -> np.ndarray:
    """Flat or nested JSON data as an ndarray of the datatype, shaped as declared.

    Where MLServer is looser than the V2 specification, its clients rely on it: BYTES
    data whose count is not the shape's (one string with its length as shape, two with
    ``[2, 11]``) comes back flat, with its own shape; numeric data must fit its shape."""
    expected = element_count(shape)
    if datatype == "BYTES":
        values = _bytes_from_json(data, name)
        if values.size != expected:
            return values  # flat: MLServer's loose string shapes
    else:
        try:
            values = np.asarray(data)
        except (ValueError, TypeError):
            _check_numpy_depth(data, name)
            raise BadRequest(f"input '{name}': data is ragged or not numeric") from None
        _check_data_depth(values, name)
        if values.size and values.dtype.kind in "fO" and datatype in ("INT64", "UINT64"):
            # Integers beyond int64 made numpy fall back to float (losing digits) or object.
            values = _wide_integers(data, values, datatype, name)
        values = cast_checked(values, datatype, name)
    if values.size != expected:
        raise BadRequest(json_scan.count_mismatch(name, shape, expected, values.size))
    return values.reshape(shape)


def _check_data_depth(values: np.ndarray, name: str) -> None:
    depth = limits.current().max_json_depth
    if values.ndim > depth - _DATA_DEPTH:
        raise BadRequest(
            f"input '{name}': data is nested deeper than the limit of {depth} (max_json_depth)"
        )


def _check_numpy_depth(data: object, name: str) -> None:
    """A 400 saying so when data nests deeper than numpy can hold: numpy 1 calls that
    ragged (or leaves lists inside an object array), below ``max_json_depth``. Read only
    once numpy has refused the data: the walk costs nothing to a valid request."""
    if isinstance(data, list) and nested_deeper(data, NUMPY_MAX_DIMS):
        raise BadRequest(
            f"input '{name}': data is nested deeper than the {NUMPY_MAX_DIMS} dimensions "
            f"numpy {np.__version__} holds"
        )


def _wide_integers(data: object, values: np.ndarray, datatype: str, name: str) -> np.ndarray:
    """64-bit integers parsed exactly (the rare path: some value is beyond int64)."""
    items = np.asarray(data, dtype=object)
    flat = items.reshape(-1).tolist()
    if not all(type(item) is int for item in flat):
        return values  # real floats (or worse): cast_checked refuses them
    info = np.iinfo(numpy_dtype(datatype))
    if min(flat) < info.min or max(flat) > info.max:
        raise BadRequest(
            f"input '{name}': a value is out of range for {datatype} [{info.min}, {info.max}]"
        )
    return np.array(flat, dtype=numpy_dtype(datatype)).reshape(items.shape)


def _bytes_from_json(data: object, name: str) -> np.ndarray:
    """JSON strings (nested or flat) as UTF-8 ``bytes``: BYTES decode the same way over
    every wire format, and a codec (``str``, ``json``, ...) takes them from there."""
    if isinstance(data, str):
        data = [data]  # MLServer takes a bare string as a list of one
    elif not isinstance(data, list):
        raise BadRequest(f"input '{name}': BYTES data must be a list of strings")
    try:
        strings = np.asarray(data, dtype=object)
    except ValueError:
        raise BadRequest(f"input '{name}': BYTES data is ragged") from None
    _check_data_depth(strings, name)
    try:
        encoded = [item.encode() for item in strings.reshape(-1).tolist()]
    except AttributeError:
        if strings.ndim == NUMPY_MAX_DIMS:  # numpy stopped there: lists are left inside
            _check_numpy_depth(data, name)
        raise BadRequest(f"input '{name}': BYTES data must be strings") from None
    out = np.empty(len(encoded), dtype=object)
    out[:] = encoded
    return out


def encode_response(response: InferenceResponse, outputs: list[Tensor] | None = None) -> bytes:
    """Serialise a response (``outputs`` in place of its own, e.g. with binary ones
    reduced to headers); output data is always flat, row-major."""
    document: dict[str, Any] = {
        "model_name": response.model_name,
        "id": response.id,
        "parameters": response.parameters,
        "outputs": [output_document(o) for o in (response.outputs if outputs is None else outputs)],
    }
    if response.model_version is not None:
        document["model_version"] = response.model_version
    return orjson.dumps(document, option=_DUMP_OPTIONS)


def decode_response(body: bytes, json_length: int | None = None) -> InferenceResponse:
    """Parse a V2 REST response (with Triton binary outputs after ``json_length`` bytes):
    what clients, tests and benchmarks use to read a reply back into tensors."""
    view = memoryview(body)
    header = body if json_length is None else bytes(view[:json_length])
    document = parse_json_object(header, "response body")
    binary = view[json_length:] if json_length is not None else None
    return response_from_document(document, binary)


def response_from_document(
    document: dict[str, Any], binary_tail: memoryview | None = None
) -> InferenceResponse:
    """A response from its parsed JSON; ``binary_tail`` holds Triton binary outputs."""
    raw_outputs = document.get("outputs")
    if not isinstance(raw_outputs, list):
        raise BadRequest("response must have an 'outputs' list")
    outputs = [tensor_from_document(raw, i, "output") for i, raw in enumerate(raw_outputs)]
    if binary_tail is not None:
        from inferpool.protocol.binary import attach_binary_tensors

        attach_binary_tensors(outputs, binary_tail, "output")
    return InferenceResponse(
        model_name=str(document.get("model_name", "")),
        outputs=outputs,
        model_version=document.get("model_version"),
        id=document.get("id"),
        parameters=_parameters(document.get("parameters"), "response"),
    )


def output_document(output: Tensor) -> dict[str, Any]:
    document: dict[str, Any] = {
        "name": output.name,
        "shape": list(output.shape),
        "datatype": output.datatype,
    }
    parameters = output.parameters
    # Binary: it follows the JSON; in a shared-memory region: it is there already.
    if "binary_data_size" not in parameters and REGION not in parameters:
        document["data"] = json_data(output)
    if output.parameters:
        document["parameters"] = output.parameters
    return document


def json_data(output: Tensor) -> Any:
    data = output.data.reshape(-1)
    if output.datatype == "BYTES":
        return _bytes_to_json(output, data)
    if data.dtype.kind == "f":
        if not np.isfinite(data).all():
            # orjson would write null; write the literals Python's json (so MLServer and
            # tritonclient) reads back as the same values.
            return orjson.Fragment(json.dumps(data.tolist()))
        if data.dtype == np.float16:
            data = data.astype(np.float32)
    return np.ascontiguousarray(data)


def _bytes_to_json(output: Tensor, data: np.ndarray) -> list[str]:
    items: list[Any] = data.tolist()
    if data.dtype.kind == "U" or all(isinstance(item, str) for item in items):
        return items
    try:
        return [item.decode() if isinstance(item, bytes) else str(item) for item in items]
    except UnicodeDecodeError:
        # JSON cannot carry raw bytes: send base64 and say so, as the base64 codec would
        # (the image codec reads base64 text itself: an image output keeps its label).
        if output.parameters.get("content_type") != "image":
            output.parameters["content_type"] = "base64"
        return [
            base64.b64encode(item if isinstance(item, bytes) else str(item).encode()).decode()
            for item in items
        ]


# Response ids for requests that carry none: version-4 UUIDs from a generator of their own,
# seeded from the OS at import and again in every forked child (a worker is forked from the
# template, so without the reseed siblings would draw the same ids). uuid.uuid4 costs a
# getrandom call and a UUID object, 4.1 µs a call here against 1.4 µs; the ids
# are names, not secrets. Not the random module's generator: a runtime that seeds it for
# its own reasons must not make every worker repeat the same ids.
_IDS = random.Random()
os.register_at_fork(after_in_child=_IDS.seed)
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC << 60))  # the version and variant bits
_UUID4_SET = (0x4000 << 64) | (0x8 << 60)  # version 4, RFC 4122 variant


def new_request_id() -> str:
    """A random version-4 UUID in its 36-character form."""
    text = f"{_IDS.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
