"""Calls from a model's runtime to another model of the same server, through the engine.

A runtime's ``predict`` (an explainer, a post-processor, business logic in front of other
models: Triton's "BLS") calls ``infer("iris", {"x": rows})`` and gets the other model's
V2 response back, its outputs' ``data`` as numpy arrays of their shapes. The call is
synchronous (the explainer libraries call their predict functions so) and never goes over
HTTP: in a worker it travels to the frontend on the control channel (``Call``, answered
``CallReply``), which runs it as any request (readiness, rate limits, the least-loaded
worker holding the model, statistics) and answers back; with ``--workers 0`` the predict
thread hands it to the event loop directly. The body is a V2 REST request as the workers
decode one: JSON, numeric tensors after it in Triton's binary form, and the response
asked for in binary too (at 1000 rows a call costs about 60 % of its JSON form's time;
the same at 1 row); the reply is that response, or the error's message.

Bounds: a call gives up after ``timeout`` seconds (504); calls nest at most ``MAX_DEPTH``
deep, and a model may not call itself or a model that called it (400: the frontend
refuses it before it runs, naming the chain). A call that fails raises ``CallError``
with the callee's status and message: a runtime that lets it propagate answers its own
request with that status.

This module is a leaf: where calls go (``Backend``) is installed by the process that runs
runtimes (``engine/worker/calls.py`` in a worker, ``engine/call_server.py`` in-process).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from inferpool.errors import InferpoolError

__all__ = ["MAX_DEPTH", "CallError", "infer"]

# Models in one chain of calls: the outer request's model and the ones it calls, nested.
MAX_DEPTH = 8
# Seconds a call may take when its caller does not say.
DEFAULT_TIMEOUT = 60.0


class CallError(InferpoolError):
    """A call to another model failed: its status (404 unknown, 503 not ready, 504 past
    its timeout, 400 a cycle or a bad request, ...) and the callee's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Backend(Protocol):
    """Where this process sends calls: a V2 request body (its JSON part ``json_length``
    bytes long when binary tensors follow, else None) → ``(status, body, json_length)``."""

    def call(
        self, model: str, version: str | None, body: bytes, json_length: int | None, timeout: float
    ) -> tuple[int, bytes, int | None]: ...


_backend: Backend | None = None


def install(backend: Backend | None) -> None:
    """Send this process's calls through ``backend`` (None: calls are refused)."""
    global _backend
    _backend = backend


def uninstall(backend: Backend | None) -> None:
    """Stop sending calls through ``backend`` if it is the one installed."""
    global _backend
    if backend is not None and _backend is backend:
        _backend = None


def infer(
    model: str,
    inputs: Mapping[str, Any] | list[Mapping[str, Any]],
    *,
    version: str | None = None,
    outputs: list[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run ``model`` on ``inputs`` and return its V2 response as a dict, each output's
    ``data`` a numpy array of its ``shape`` (BYTES: an object array).

    ``inputs``: ``{name: array-like}`` (the datatype follows the array's dtype), or a
    list of V2 input tensors (dicts with ``name``, ``shape``, ``datatype``, ``data``).
    ``outputs``: the names to return (default: the model's). Raises ``CallError``.
    """
    backend = _backend
    if backend is None:
        raise CallError(
            500, f"cannot call model '{model}': calls run only inside a server's runtime"
        )
    wait = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if not wait > 0:
        raise CallError(400, f"call to model '{model}': timeout must be positive, not {timeout}")
    body, json_length = request_body(inputs, outputs, parameters)
    status, answer, answer_json = backend.call(model, version, body, json_length, wait)
    if status != 200:
        raise CallError(
            status, f"call to model '{model}' failed: {answer.decode(errors='replace')}"
        )
    return decode_response(answer, answer_json)


def request_body(
    inputs: Mapping[str, Any] | list[Mapping[str, Any]],
    outputs: list[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """The V2 request body of a call and the length of its JSON part (None: all JSON).

    Numeric arrays travel as Triton's binary tensors after the JSON, and the response is
    asked for in binary (``binary_data_output``): no float goes through text either way.
    """
    import numpy as np

    from inferpool.protocol.datatypes import datatype_of

    tensors: list[Any]
    tail: list[bytes] = []
    if isinstance(inputs, Mapping):
        tensors = []
        for name, value in inputs.items():
            array = np.asarray(value)
            tensor: dict[str, Any] = {"name": name, "shape": list(array.shape)}
            if array.dtype.kind in "OUS":
                tensor["datatype"] = "BYTES"
                tensor["data"] = [str(item) for item in array.ravel().tolist()]
            else:
                tensor["datatype"] = datatype_of(array)
                raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
                tensor["parameters"] = {"binary_data_size": len(raw)}
                tail.append(raw)
            tensors.append(tensor)
    else:
        tensors = list(inputs)
    document: dict[str, Any] = {"inputs": tensors}
    if outputs:
        document["outputs"] = [{"name": name} for name in outputs]
    document["parameters"] = {"binary_data_output": True, **(parameters or {})}
    try:
        head = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        raise CallError(400, f"cannot encode the call's inputs: {exc}") from None
    if not tail:
        return head, None
    return b"".join([head, *tail]), len(head)


def decode_response(body: bytes, json_length: int | None = None) -> dict[str, Any]:
    """A V2 response (its binary tensors after ``json_length`` bytes of JSON) with each
    output's data as a numpy array of its shape."""
    import numpy as np

    from inferpool.protocol.datatypes import NUMPY_BY_DATATYPE

    response: dict[str, Any] = orjson.loads(body if json_length is None else body[:json_length])
    offset = len(body) if json_length is None else json_length
    for output in response.get("outputs", ()):
        datatype = output.get("datatype", "")
        shape = output.get("shape", [-1])
        size = (output.get("parameters") or {}).get("binary_data_size")
        if size is None:
            dtype = object if datatype == "BYTES" else NUMPY_BY_DATATYPE.get(datatype)
            output["data"] = np.array(output.get("data", []), dtype=dtype).reshape(shape)
            continue
        raw = body[offset : offset + size]
        offset += size
        if datatype == "BYTES":
            output["data"] = np.array(_strings(raw), dtype=object).reshape(shape)
        else:
            dtype = NUMPY_BY_DATATYPE[datatype].newbyteorder("<")
            output["data"] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    return response


def _strings(raw: bytes) -> list[str | bytes]:
    """Binary BYTES elements (each a 4-byte little-endian length, then its bytes), as
    text where they are UTF-8 (as the JSON form gives them), else as bytes."""
    items: list[str | bytes] = []
    position = 0
    while position + 4 <= len(raw):
        length = int.from_bytes(raw[position : position + 4], "little")
        item = raw[position + 4 : position + 4 + length]
        position += 4 + length
        try:
            items.append(item.decode())
        except UnicodeDecodeError:
            items.append(item)
    return items
