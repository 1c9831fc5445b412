"""What both frontends report about a finished request: the access log line and its span.

The access log is off by default (``--access-log`` turns it on); one line per request goes
to the ``inferpool.access`` logger, readable as text::

    REST POST /v2/models/iris/infer peer=127.0.0.1:50312 model=iris version=- status=200
    rows=1 time=0.84ms request_id=3f9a1c2e-17

and with the same fields as the record's attributes (``extra=``: ``protocol``, ``method``,
``peer``, ``model``, ``version``, ``status``, ``rows``, ``duration_ms``, ``request_id``),
which the JSON log format prints as keys. ``status`` is the HTTP status (REST) or the gRPC
status name (gRPC); ``rows`` the inferences the request held (0 when it ran none).

The REST side of both (the log and the tracer's span, ``tracing.RequestTracer``) is one
ASGI middleware, ``RestObserver``, in the stack only when one of them is on. The routes that
infer leave their request id and reply in the scope (``REQUEST_ID``, ``REPLY``) for it.
The gRPC servers report through one
``grpc/observer.py`` ``CallObserver`` each.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

from inferpool.engine.ipc.messages import Reply
from inferpool.errors import BadRequest
from inferpool.frontends import request_context

if TYPE_CHECKING:
    from inferpool.observability.tracing import RequestTracer

logger = logging.getLogger("inferpool.access")

# Scope keys an inference route sets (rest/): its resolved request id, and the reply.
REQUEST_ID = "inferpool.request_id"
REPLY = "inferpool.reply"
# The label of the API key a request carried (rest/key_guard.py), if any.
API_KEY = "inferpool.api_key"

# /v2/models/{name}/..., /v2/repository/models/{name}/...; /v2/models/stats names no model.
_MODEL_IN_PATH = re.compile(r"^/v2/(?:repository/)?models/(?!stats(?:/|$))([^/]+)")


def log_request(
    protocol: str,
    method: str,
    peer: str | None,
    model: str,
    version: str | None,
    status: str | int,
    rows: int,
    started: float,
    request_id: str | None,
    key: str | None = None,
) -> None:
    """Log one finished request; ``started`` is its ``time.perf_counter()`` at arrival;
    ``key``: the label of the API key it carried (``api_keys.py``; never the key)."""
    elapsed_ms = round((time.perf_counter() - started) * 1000, 3)
    fields = {
        "protocol": protocol,
        "method": method,
        "peer": peer or "-",
        "model": model,
        "version": version or "-",
        "status": status,
        "rows": rows,
        "duration_ms": elapsed_ms,
        "request_id": request_id or "-",
    }
    line = "%s %s peer=%s model=%s version=%s status=%s rows=%d time=%.2fms request_id=%s"
    if key is not None:
        fields["api_key"] = key
        line += " api_key=%s"
    logger.info(line, *fields.values(), extra=fields)


def model_in_path(path: str) -> str:
    match = _MODEL_IN_PATH.match(path)
    return match.group(1) if match else "-"


def peer_of(scope: dict[str, Any]) -> str | None:
    """``host:port`` of an ASGI request's client, if the server knows it."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else None


def given_id(headers: Any) -> str | None:
    """The client's ``x-request-id`` of a request that resolves none itself (not an
    inference), for its log line: None if absent or unusable. ``headers``: an HTTP
    request's or gRPC call's ``(name, value)`` pairs, bytes or str."""
    try:
        for name, value in headers:
            if name == request_context.HEADER_BYTES or name == request_context.HEADER:
                text = value if isinstance(value, str) else value.decode("latin-1")
                return request_context.checked(text)
    except BadRequest:
        pass
    return None


class RestObserver:
    """ASGI middleware: once a request's response is written (or failed), its access log
    line (``log``) and, for an inference, its span (``tracer``, or None)."""

    def __init__(self, app: Any, log: bool = False, tracer: RequestTracer | None = None) -> None:
        self.app = app
        self.log = log
        self.tracer = tracer

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        start_ns = time.time_ns() if self.tracer is not None else 0
        status = 500

        async def send_and_note_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        error = None
        try:
            await self.app(scope, receive, send_and_note_status)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._report(scope, status, started, start_ns, error)

    def _report(
        self, scope: dict[str, Any], status: int, started: float, start_ns: int, error: str | None
    ) -> None:
        path = scope["path"]
        params = scope.get("path_params") or {}
        version = params.get("version")
        reply: Reply | None = scope.get(REPLY)
        request_id: str | None = scope.get(REQUEST_ID)
        if self.log:
            log_request(
                "REST",
                f"{scope['method']} {path}",
                peer_of(scope),
                model_in_path(path),
                version,
                status,
                reply.rows if reply is not None else 0,
                started,
                request_id if REQUEST_ID in scope else given_id(scope["headers"]),
                scope.get(API_KEY),
            )
        if self.tracer is not None and REQUEST_ID in scope:
            traceparent, tracestate = trace_headers(scope["headers"])
            if error is None and reply is not None and reply.status >= 500:
                error = reply.body.decode("utf-8", "replace")
            self.tracer.finish(
                protocol="rest",
                method=scope["method"],
                model=params.get("name", "-"),
                version=version,
                traceparent=traceparent,
                tracestate=tracestate,
                start_ns=start_ns,
                end_ns=time.time_ns(),
                code=status,
                request_id=request_id,
                peer=peer_of(scope),
                reply=reply,
                error=error,
            )


def trace_headers(headers: Any) -> tuple[str | None, str | None]:
    """W3C ``traceparent`` and ``tracestate`` of a request's headers or gRPC metadata
    (``(name, value)`` pairs, bytes or str; names lower-case)."""
    parent = state = None
    for name, value in headers:
        if isinstance(name, bytes):
            name = name.decode("latin-1")
        if name == "traceparent":
            parent = value if isinstance(value, str) else value.decode("latin-1")
        elif name == "tracestate":
            state = value if isinstance(value, str) else value.decode("latin-1")
    return parent, state
