"""A ``Kind.CUSTOM`` job in the worker: a runtime's custom endpoint, MLflow's scoring
endpoints, ``explain`` and KServe V1's ``:predict``/``:explain``, which every model answers,
or a feedback for the runtime's ``feedback`` hook.

The call's head (``protocol.endpoints.Call``) names the path; the handler's answer (a
body, or an ``EndpointResponse``) becomes a reply that carries its status, content type
and headers (``protocol.endpoints.answer_reply``). A handler that raises is the model's
fault (500, logged with its traceback) unless it raised an ``InferpoolError`` (its own
status, e.g. ``BadRequest``): the same rule as ``predict``.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from collections.abc import Callable
from typing import Any

import orjson
from google.protobuf.message import DecodeError

from inferpool.codecs.mlflow_scoring import scoring_endpoint
from inferpool.engine.ipc.messages import Reply, StageTimes
from inferpool.engine.worker import inference
from inferpool.engine.worker.explain import explain_endpoint
from inferpool.engine.worker.kserve_v1 import v1_endpoint
from inferpool.engine.worker.model import LoadedModel
from inferpool.errors import BadRequest, InferpoolError, ModelNotFound
from inferpool.protocol import grpc_wire, rest_json
from inferpool.protocol.endpoints import (
    FEEDBACK_GRPC,
    FEEDBACK_JSON,
    Answer,
    Call,
    MethodNotAllowed,
    answer_head,
    read_call,
)
from inferpool.protocol.generated import inferpool_ext_pb2 as ext
from inferpool.protocol.rest_json import parse_json_object
from inferpool.runtimes.endpoints import EndpointRequest, EndpointResponse

logger = logging.getLogger(__name__)

JSON = "application/json"
# RFC 9110's token (a header name); a value holds no control characters but tab.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")
# Headers the server writes itself.
_OWN_HEADERS = frozenset(
    {"content-length", "content-type", "transfer-encoding", "connection", "x-request-id"}
)


def call_custom(model: LoadedModel, body: bytes, enqueued_ns: int, started: int) -> Reply:
    """The reply of one ``Kind.CUSTOM`` request body; raises for a path the model does
    not serve or a handler that fails (the caller makes the error its reply)."""
    call, payload = read_call(body)
    reward: float | None = None
    if call.path == FEEDBACK_JSON or call.path == FEEDBACK_GRPC:
        arguments = _feedback_arguments(call.path, payload)
        reward = arguments[2]
        function: Callable[[], Any] = functools.partial(model.runtime.feedback, *arguments)
        where = "feedback"
    else:
        function = functools.partial(_handler(model, call), _request(call, payload))
        where = f"custom endpoint '/{call.path}'"
    called = time.monotonic_ns()
    try:
        result = function()
    except Exception as exc:
        if not isinstance(exc, InferpoolError):  # a bug of the handler: keep its traceback
            logger.exception("%s of model %r raised", where, model.name)
        raise inference.model_failure(model, exc) from None
    returned = time.monotonic_ns()
    if reward is not None and result is None:
        result = {}
    try:
        status, answer, out = _answer(result, reward)
    except (TypeError, ValueError) as exc:
        raise InferpoolError(f"{where} of model '{model.name}' answered badly: {exc}") from None
    head = answer_head(answer)
    reply = Reply(status, head + out, len(head))
    reply.times = StageTimes(
        started - enqueued_ns, called - started, returned - called, time.monotonic_ns() - returned
    )
    reply.rows = reply.execution = 1
    return reply


def _handler(model: LoadedModel, call: Call) -> Callable[[EndpointRequest], Any]:
    """The handler of the call's path: the runtime's, else MLflow's scoring endpoints,
    ``explain`` (``explain.py``) or KServe V1's (``kserve_v1.py``), which every model
    answers."""
    endpoint = model.endpoints.get(call.path)
    if endpoint is not None:
        if call.method not in endpoint.methods:  # the frontend checks; a direct caller may not
            raise MethodNotAllowed(
                f"custom endpoint '/{call.path}' of model '{model.name}' answers "
                f"{', '.join(endpoint.methods)}, not {call.method}",
                endpoint.methods,
            )
        return endpoint.call
    scoring = (
        scoring_endpoint(
            call.path, model.runtime.custom_endpoints(), functools.partial(inference.infer, model)
        )
        or explain_endpoint(call.path, model)
        or v1_endpoint(call.path, model)
    )
    if scoring is None:
        raise ModelNotFound(f"model '{model.name}' has no endpoint '/{call.path}'")
    return lambda request: EndpointResponse(scoring(request.body), content_type=JSON)


def _request(call: Call, body: bytes) -> EndpointRequest:
    headers = {name.lower(): value for name, value in call.headers}
    return EndpointRequest(call.method, call.path, call.query, headers, body)


def _answer(result: Any, reward: float | None) -> tuple[int, Answer, bytes]:
    """A handler's result as (status, answer head, body bytes); ValueError or TypeError for
    a result that cannot go out (a bad status or header, a body JSON cannot hold)."""
    status, content_type, headers = 200, None, {}
    if isinstance(result, EndpointResponse):
        status, content_type, headers = result.status, result.content_type, result.headers
        result = result.body
        if type(status) is not int or not 200 <= status <= 599:
            raise ValueError(f"status {status!r} is not an HTTP status from 200 to 599")
    if isinstance(result, bytes | bytearray | memoryview):
        body, default = bytes(result), "application/octet-stream"
    elif isinstance(result, str):
        body, default = result.encode(), "text/plain; charset=utf-8"
    else:
        body, default = orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY), JSON
    pairs = []
    for name, value in headers.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ValueError(f"header name {name!r} is not a valid HTTP header name")
        if not isinstance(value, str) or not _VALUE.fullmatch(value):
            raise ValueError(f"header {name!r}: value {value!r} must be text on one line")
        if name.lower() in _OWN_HEADERS:
            raise ValueError(f"header {name!r} is the server's own (set content_type instead)")
        pairs.append((name.lower(), value))
    content_type = content_type or default
    if not _VALUE.fullmatch(content_type):
        raise ValueError(f"content type {content_type!r} must be text on one line")
    return status, Answer(content_type, pairs, reward), body


# -- feedback --------------------------------------------------------------------------------
def _feedback_arguments(path: str, payload: bytes) -> tuple[Any, Any, float, Any]:
    """The hook's (request, response, reward, truth) from a feedback's body: the REST
    document or a serialized ``inferpool.ModelFeedbackRequest``; a 400 says what is wrong."""
    if path == FEEDBACK_GRPC:
        try:
            message = ext.ModelFeedbackRequest.FromString(payload)
        except DecodeError:
            raise BadRequest("the feedback is not a valid inferpool.ModelFeedbackRequest") from None
        if not message.HasField("request") or not message.HasField("response"):
            raise BadRequest("the feedback needs both 'request' and 'response'")
        truth = (
            grpc_wire.response_from_message(message.truth) if message.HasField("truth") else None
        )
        return (
            grpc_wire.decode(message.request.SerializeToString()),
            grpc_wire.response_from_message(message.response),
            _reward(message.reward),
            truth,
        )
    document = parse_json_object(payload, "the feedback body")
    missing = [key for key in ("request", "response", "reward") if key not in document]
    if missing:
        raise BadRequest(f"the feedback body needs {', '.join(repr(key) for key in missing)}")
    unknown = sorted(set(document) - {"request", "response", "reward", "truth"})
    if unknown:
        raise BadRequest(f"the feedback body has unknown member(s) {', '.join(unknown)}")
    raw_request, raw_response = document["request"], document["response"]
    if not isinstance(raw_request, dict) or not isinstance(raw_response, dict):
        raise BadRequest("the feedback's 'request' and 'response' must be V2 JSON objects")
    request = rest_json.request_from_document(raw_request, binary_tail=None)
    response = rest_json.response_from_document(raw_response)
    truth = document.get("truth")
    if isinstance(truth, dict) and "outputs" in truth:
        truth = rest_json.response_from_document(truth)
    return request, response, _reward(document["reward"]), truth


def _reward(value: object) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        raise BadRequest(f"the feedback's 'reward' must be a finite number, not {value!r}")
    return float(value)  # type: ignore[arg-type]
