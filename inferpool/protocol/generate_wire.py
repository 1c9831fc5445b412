"""The "generate" extension's wire format (KServe / Triton ``generate`` and
``generate_stream``): a flat JSON object in, a flat JSON object out.

A request's keys other than ``id`` and ``parameters`` are its inputs, one tensor each
named by its key (``{"text_input": "hi"}`` is the BYTES input ``text_input`` of shape
[1]; a list is a tensor of its length); ``parameters`` are the request's parameters.
A response holds ``model_name``, ``model_version``, ``id`` and one key per output: its
single element (``"text_output": "..."``), or its flat data when it has several.
A body whose ``inputs`` is a list is a V2 request instead, answered in V2: MLServer's
``generate`` endpoints are aliases of ``infer``, and its clients send those.
``engine/worker/wire_formats.py`` maps ``Kind.GENERATE`` to this module (a ``WireFormat``).
"""

from __future__ import annotations

from typing import Any

import orjson

from inferpool.errors import BadRequest
from inferpool.protocol import rest_json
from inferpool.protocol.types import InferenceRequest, InferenceResponse

_RESERVED = frozenset({"id", "parameters"})


class V2Request(InferenceRequest):
    """A V2 request that came to a generate endpoint (MLServer's alias of infer): its
    response is V2 too."""

    __slots__ = ()


def decode(body: bytes, json_length: int | None = None) -> InferenceRequest:
    document = rest_json.parse_json_object(body)
    if isinstance(document.get("inputs"), list):
        plain = rest_json.request_from_document(document, None)
        return V2Request(plain.inputs, plain.id, plain.outputs, plain.parameters)
    inputs = [_tensor(key, value) for key, value in document.items() if key not in _RESERVED]
    if not inputs:
        raise BadRequest("a generate request needs at least one input, e.g. 'text_input'")
    v2: dict[str, Any] = {"inputs": inputs}
    for key in _RESERVED:
        if key in document:
            v2[key] = document[key]
    return rest_json.request_from_document(v2, None)


def _tensor(name: str, value: Any) -> dict[str, Any]:
    data = value if isinstance(value, list) else [value]
    if not data:
        raise BadRequest(f"generate input '{name}' is empty")
    first = data[0]
    if isinstance(first, bool):
        datatype = "BOOL"
    elif isinstance(first, int):
        datatype = "INT64"
    elif isinstance(first, float):
        datatype = "FP64"
    elif isinstance(first, str):
        datatype = "BYTES"
    else:
        raise BadRequest(f"generate input '{name}' must be a string, a number or a list of them")
    spec: dict[str, Any] = {"name": name, "datatype": datatype, "shape": [len(data)], "data": data}
    if datatype == "BYTES":
        spec["parameters"] = {"content_type": "str"}
    return spec


def encode(response: InferenceResponse, request: InferenceRequest) -> tuple[bytes, None]:
    if isinstance(request, V2Request):
        return rest_json.encode_response(response), None
    v2 = orjson.loads(rest_json.encode_response(response))
    document: dict[str, Any] = {
        "model_name": v2["model_name"],
        "model_version": v2.get("model_version") or "",
    }
    if v2.get("id"):
        document["id"] = v2["id"]
    for output in v2["outputs"]:
        data = output.get("data", [])
        document[output["name"]] = data[0] if len(data) == 1 else data
    return orjson.dumps(document), None
