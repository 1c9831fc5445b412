"""What both gRPC servers report about a finished call: its access log line and, for
ModelInfer, its span.

One ``CallObserver`` per server (``h2.py``, ``aio.py``) holds whether the access log is
on and the tracer (or None); each call hands it what it knows once it ends, so both
servers write the same line and the same span. The REST side of both is
``access_log.RestObserver``; the line itself is ``access_log.log_request``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from inferpool.engine.ipc.messages import Reply
from inferpool.errors import HTTP_OF_GRPC
from inferpool.frontends.access_log import given_id, log_request, trace_headers
from inferpool.frontends.grpc.custom import log_method
from inferpool.frontends.grpc.service import SERVICE, route_of

if TYPE_CHECKING:
    from inferpool.frontends.api_keys import ApiKeys
    from inferpool.observability.tracing import RequestTracer


class CallObserver:
    """The access log (``log``) and the tracer's spans (``tracer``, or None) of a server's
    calls."""

    __slots__ = ("keys", "log", "on", "tracer")

    def __init__(
        self, log: bool, tracer: RequestTracer | None = None, keys: ApiKeys | None = None
    ) -> None:
        self.log = log
        self.tracer = tracer
        self.keys = keys  # the API keys: a line names the label of the call's key
        # Whether a call must note its peer and metadata at all.
        self.on = log or tracer is not None

    def finished(
        self,
        method: str,
        request: Any,
        headers: Any,
        peer: str | None,
        code: str,
        text: str,
        reply: Reply | None,
        started: float,
        start_ns: int,
        request_id: str | None = None,
    ) -> None:
        """A unary call ended with status ``code`` (its name; ``text`` its message, "" when
        OK). ``request``: the parsed message, or the raw bytes of ModelInfer (or of one
        that did not parse); ``headers`` the call's metadata; ``started`` its
        ``time.perf_counter()`` at arrival, ``start_ns`` its ``time.time_ns()`` (read only
        when traced). ``request_id``: ModelInfer's resolved id, whose call is traced; None
        for the other methods (their log line shows the client's ``x-request-id``, if
        any)."""
        if self.log:
            model, version = route_of(request)
            rows = reply.rows if reply is not None else 0
            known = request_id if request_id is not None else given_id(headers)
            shown = log_method(method, request)
            key = self.keys.label(headers) if self.keys is not None else None
            log_request("gRPC", shown, peer, model, version, code, rows, started, known, key)
        if self.tracer is not None and request_id is not None:
            model, version = route_of(request)
            traceparent, tracestate = trace_headers(headers)
            self.tracer.finish(
                protocol="grpc",
                method=f"/{SERVICE}/{method}",
                model=model,
                version=version,
                traceparent=traceparent,
                tracestate=tracestate,
                start_ns=start_ns,
                end_ns=time.time_ns(),
                code=HTTP_OF_GRPC[code],
                request_id=request_id,
                peer=peer,
                reply=reply,
                error=text or None,
            )

    def stream_finished(
        self, method: str, headers: Any, peer: str | None, code: str, started: float
    ) -> None:
        """A streaming call (Watch, ModelStreamInfer) ended with status ``code``: its log
        line (the caller asks only when ``log`` is on; such calls are not traced)."""
        log_request("gRPC", method, peer, "-", None, code, 0, started, given_id(headers))
