"""The REST wire format: a V2 JSON request body to an InferenceRequest, a response to JSON bytes.

Runs where the tensors are handled (a worker, or the frontend with ``workers=0``).
Numeric data goes JSON → numpy in one vectorised step (orjson, then ``np.asarray``), and
numpy → JSON with orjson's native numpy serialisation: no Python loop per element.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import numpy as np
import orjson

from inferpool.errors import BadRequest
from inferpool.protocol.datatypes import cast_checked, check_shape, element_count, numpy_dtype
from inferpool.protocol.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

_DUMP_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def parse_json_object(body: bytes, what: str = "request body") -> dict[str, Any]:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return document


def decode_request(body: bytes) -> InferenceRequest:
    """Parse a V2 JSON inference request; every problem is a 400 naming the input."""
    document = parse_json_object(body)
    return request_from_document(document, binary_tail=None)


def request_from_document(
    document: dict[str, Any], binary_tail: memoryview | None
) -> InferenceRequest:
    """Build a request from its parsed JSON; ``binary_tail`` holds Triton binary tensors."""
    raw_inputs = document.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("request must have a non-empty 'inputs' list")
    inputs = [_decode_input(raw, index) for index, raw in enumerate(raw_inputs)]
    if binary_tail is not None:
        from inferpool.protocol.binary import attach_binary_inputs

        attach_binary_inputs(inputs, raw_inputs, binary_tail)
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest("request 'id' must be a string")
    return InferenceRequest(
        inputs=inputs,
        id=request_id,
        outputs=_decode_outputs(document.get("outputs")),
        parameters=_parameters(document.get("parameters"), "request"),
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


def _decode_input(raw: object, index: int) -> Tensor:
    if not isinstance(raw, dict):
        raise BadRequest(f"input {index} must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"input {index} must have a 'name'")
    datatype = raw.get("datatype")
    numpy_dtype(datatype, name)
    shape = check_shape(raw.get("shape"), name)
    parameters = _parameters(raw.get("parameters"), f"input '{name}'")
    if "binary_data_size" in parameters:
        # Filled in from the binary tail by attach_binary_inputs.
        return Tensor(name, datatype, shape, np.empty(0), parameters)
    if "data" not in raw:
        raise BadRequest(f"input '{name}' has no 'data'")
    data = tensor_data_from_json(raw["data"], datatype, shape, name)
    return Tensor(name, datatype, shape, data, parameters)


def tensor_data_from_json(data: object, datatype: str, shape: tuple[int, ...], name: str):
    """Flat or nested JSON data as an ndarray of the datatype, shaped as declared."""
    expected = element_count(shape)
    if datatype == "BYTES":
        values = _bytes_from_json(data, name)
    else:
        try:
            values = np.asarray(data)
        except (ValueError, TypeError):
            raise BadRequest(f"input '{name}': data is ragged or not numeric") from None
        if datatype == "UINT64" and values.dtype.kind in "fO":
            values = _uint64_exact(data, values, name)
        values = cast_checked(values, datatype, name)
    if values.size != expected:
        raise BadRequest(
            f"input '{name}': shape {list(shape)} needs {expected} values, got {values.size}"
        )
    return values.reshape(shape)


def _uint64_exact(data: object, values: np.ndarray, name: str) -> np.ndarray:
    """UINT64 values past the int64 range, which numpy would otherwise read as floats."""
    items = np.asarray(data, dtype=object).reshape(-1)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        return values  # floats or other types: cast_checked refuses them with a clear message
    try:
        return np.array(items.tolist(), dtype=np.uint64).reshape(values.shape)
    except OverflowError:
        raise BadRequest(f"input '{name}': a value is out of range for UINT64") from None


def _bytes_from_json(data: object, name: str) -> np.ndarray:
    try:
        strings = np.asarray(data, dtype=object)
    except ValueError:
        raise BadRequest(f"input '{name}': BYTES data is ragged") from None
    flat = strings.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    for i, item in enumerate(flat):
        if isinstance(item, str):
            out[i] = item.encode()
        else:
            raise BadRequest(f"input '{name}': BYTES data must be strings")
    return out


def encode_response(response: InferenceResponse) -> bytes:
    """Serialise a response; output data is always flat, row-major."""
    document: dict[str, Any] = {
        "model_name": response.model_name,
        "id": response.id,
        "parameters": response.parameters,
        "outputs": [output_document(output) for output in response.outputs],
    }
    if response.model_version is not None:
        document["model_version"] = response.model_version
    return orjson.dumps(document, option=_DUMP_OPTIONS)


def output_document(output: Tensor) -> dict[str, Any]:
    document: dict[str, Any] = {
        "name": output.name,
        "shape": list(output.shape),
        "datatype": output.datatype,
        "data": json_data(output),
    }
    if output.parameters:
        document["parameters"] = output.parameters
    return document


def json_data(output: Tensor) -> Any:
    data = output.data.reshape(-1)
    if output.datatype == "BYTES":
        return _bytes_to_json(output, data)
    if data.dtype == np.float16:
        data = data.astype(np.float32)
    return np.ascontiguousarray(data)


def _bytes_to_json(output: Tensor, data: np.ndarray) -> list[str]:
    items = data.tolist()
    if data.dtype.kind == "U" or all(isinstance(item, str) for item in items):
        return items
    try:
        return [item.decode() if isinstance(item, bytes) else str(item) for item in items]
    except UnicodeDecodeError:
        # JSON cannot carry raw bytes: send base64 and say so, as the base64 codec would.
        output.parameters["content_type"] = "base64"
        return [
            base64.b64encode(item if isinstance(item, bytes) else str(item).encode()).decode()
            for item in items
        ]


def new_request_id() -> str:
    return str(uuid.uuid4())
