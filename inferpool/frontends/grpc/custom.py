"""inferpool's own gRPC services (``protocol/inferpool_ext.proto``), for both gRPC servers:
``inferpool.CustomService/Call`` reaches a runtime's custom endpoints, and
``inferpool.FeedbackService/ModelFeedback`` its ``feedback`` hook.

A Call is routed and counted as REST's call of the same endpoint
(``endpoints.EndpointRouter``): an unknown model or path is NOT_FOUND, a method the
endpoint does not answer UNIMPLEMENTED. A handler's 2xx or 3xx answer is the response
(status, content type, headers, body); a 4xx or 5xx ends the call with the matching gRPC
status and the handler's message (its JSON ``error``, else its body as text).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from inferpool.engine.ipc.messages import Reply
from inferpool.errors import from_status
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.endpoints import EndpointRouter, endpoint_path
from inferpool.protocol.endpoints import FEEDBACK_GRPC, read_answer
from inferpool.protocol.generated import inferpool_ext_pb2 as ext

CUSTOM_SERVICE = "inferpool.CustomService"
FEEDBACK_SERVICE = "inferpool.FeedbackService"
# What an error's message may take from a handler's body.
_MESSAGE_LIMIT = 1024


class ExtensionServices:
    """CustomService and FeedbackService over one data plane. ``context``: grpc.aio's
    ServicerContext or the HTTP/2 layer's (``time_remaining()``)."""

    def __init__(self, plane: DataPlane) -> None:
        self.router = EndpointRouter(plane)

    async def call(self, request: ext.CallRequest, context: Any) -> ext.CallResponse:
        method = (request.method or "POST").upper()
        version = request.model_version or None
        path = endpoint_path(request.path)
        status = self.router.route(request.model_name, version, path, method)
        headers = [(key.lower(), value) for key, value in request.metadata.items()]
        call = self.router.call(
            status, path, method, request.query, headers, request.body, _deadline(context)
        )
        reply = await call
        self.router.count(status, "grpc", path, method, reply)
        answer = _answered(reply)
        head, body = answer
        return ext.CallResponse(
            status_code=reply.status,
            content_type=head.content_type,
            headers=dict(head.headers),
            body=body,
        )

    async def feedback(
        self, request: ext.ModelFeedbackRequest, context: Any
    ) -> ext.ModelFeedbackResponse:
        name, version = request.model_name, request.model_version or None
        body = request.SerializeToString()
        reply = await self.router.feedback(name, version, FEEDBACK_GRPC, body, _deadline(context))
        _answered(reply)
        self.router.count_feedback(name, version, reply)
        return ext.ModelFeedbackResponse()


def _answered(reply: Reply) -> Any:
    """The reply's answer head and body; raises the matching error for a 4xx or 5xx."""
    answer = read_answer(reply.body, reply.json_length)
    if answer is None:
        raise from_status(reply.status, reply.body.decode("utf-8", "replace"))
    if reply.status >= 400:
        raise from_status(reply.status, _message(answer[1]))
    return answer


def _message(body: bytes) -> str:
    """A handler's error body as a status message: its JSON ``error``, else its text."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        return str(document["error"])
    return body[:_MESSAGE_LIMIT].decode("utf-8", "replace")


def _deadline(context: Any) -> float | None:
    remaining = context.time_remaining() if context is not None else None
    return None if remaining is None else time.monotonic() + remaining


def extension_methods(services: ExtensionServices) -> dict[str, dict[str, tuple[Any, Any]]]:
    """By service name: method name → (handler(request, context), request message)."""
    return {
        CUSTOM_SERVICE: {"Call": (services.call, ext.CallRequest)},
        FEEDBACK_SERVICE: {"ModelFeedback": (services.feedback, ext.ModelFeedbackRequest)},
    }


def log_method(method: str, request: Any) -> str:
    """The access log's method of a call: a Call names its endpoint's path too."""
    if isinstance(request, ext.CallRequest):
        return f"{method} /{request.path.strip('/')}"
    return method
