"""Raw request bytes in, raw response bytes out: what a worker (or ``workers=0``) runs.

The frontend never parses tensors; it hands the body and its kind to ``handle`` wherever
the model lives, and writes the reply's bytes out unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from inferpool.engine.stats import StageTimes
from inferpool.engine.worker import inference
from inferpool.engine.worker.model import LoadedModel
from inferpool.errors import InferpoolError
from inferpool.protocol.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

# Wire formats of a request body.
KIND_REST = 0  # V2 JSON, optionally followed by Triton binary tensors (json_length set)
KIND_GRPC = 1  # a serialized inference.ModelInferRequest
KIND_CUSTOM = 2  # a runtime's custom endpoint: b"<endpoint>\\0" + the raw request body


@dataclass(slots=True)
class Reply:
    """What the frontend writes out: a 200 with the encoded response, or an error.

    For an error, ``body`` is the UTF-8 message; each frontend wraps it in its own format.
    ``json_length`` is the length of the JSON part of a REST reply that has binary tensors.
    """

    status: int
    body: bytes
    json_length: int | None = None
    times: StageTimes | None = None


Decoder = Callable[[bytes, int | None], InferenceRequest]
Encoder = Callable[[InferenceResponse, InferenceRequest], tuple[bytes, int | None]]
_WIRE_FORMATS: dict[int, tuple[Decoder, Encoder]] = {}


def register_wire_format(kind: int, decode: Decoder, encode: Encoder) -> None:
    _WIRE_FORMATS[kind] = (decode, encode)


def wire_format(kind: int) -> tuple[Decoder, Encoder]:
    if kind not in _WIRE_FORMATS:
        _load_wire_formats()
    return _WIRE_FORMATS[kind]


def _load_wire_formats() -> None:
    # Imported on first use so a process only loads the formats it serves.
    from inferpool.protocol import rest_wire  # noqa: F401

    with contextlib.suppress(ImportError):
        from inferpool.protocol import grpc_wire  # noqa: F401


def custom_body(endpoint: str, body: bytes) -> bytes:
    """The body of a KIND_CUSTOM request: the endpoint's name, NUL, then the raw body."""
    return endpoint.encode() + b"\0" + body


def handle_custom(model: LoadedModel, body: bytes) -> Reply:
    """Run a runtime's custom endpoint; its result is sent as JSON."""
    endpoint, _, payload = body.partition(b"\0")
    name = endpoint.decode("utf-8", "replace")
    function = model.runtime.custom_endpoints().get(name)
    if function is None:
        return Reply(404, f"model '{model.name}' has no endpoint '{name}'".encode())
    try:
        result = function(payload)
    except InferpoolError as exc:
        return Reply(exc.status, exc.message.encode())
    except Exception as exc:
        logger.exception("custom endpoint %r of model %r raised", name, model.name)
        return Reply(500, f"model '{model.name}' raised {type(exc).__name__}: {exc}".encode())
    if isinstance(result, bytes):
        return Reply(200, result)
    return Reply(200, orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY))


def failure(model: LoadedModel, exc: Exception) -> Reply:
    """The reply for an exception out of serving a request (here or in a batch): its own
    status for an InferpoolError (``inference.model_failure`` has already decided what a
    model's exception means), else a 500 for a fault of the server, logged."""
    if isinstance(exc, InferpoolError):
        return Reply(exc.status, exc.message.encode())
    logger.exception("unexpected error serving model %r", model.name)
    return Reply(500, f"internal error: {type(exc).__name__}: {exc}".encode())


def handle(model: LoadedModel, kind: int, body: bytes, json_length: int | None = None) -> Reply:
    """Decode, predict and encode one request; never raises."""
    if kind == KIND_CUSTOM:
        return handle_custom(model, body)
    try:
        decode, encode = wire_format(kind)
        start = time.perf_counter_ns()
        request = decode(body, json_length)
        payload, outputs = inference.prepare(model, request)
        decoded = time.perf_counter_ns()
        result = inference.predict(model, payload, outputs, request)
        predicted = time.perf_counter_ns()
        out, out_json_length = encode(inference.respond(model, request, result), request)
        encoded = time.perf_counter_ns()
    except Exception as exc:
        return failure(model, exc)
    times = StageTimes(0, decoded - start, predicted - decoded, encoded - predicted)
    return Reply(200, out, out_json_length, times)
