"""Admission from the headers: an infer request refused before its body is read.

Under overload a refusal used to cost the whole body's read (a 137 KB LightGBM body:
about 215 µs of the frontend's CPU) and came only after the body had waited in the
kernel's socket buffers. ``HeaderAdmission`` decides from the request line alone whether
``POST /v2/models/{name}[/versions/{v}]/infer`` would be refused now: the model is
unknown (404), not READY (503), or every queue that could take it is full (503, the
dispatcher's own test: ``Dispatcher.refusal``). The HTTP/1.1 protocol (``http1.py``)
asks it once the headers are parsed, answers a refusal at once with ``Connection: close``
and drops the body unread; an admitted request goes on as before, and meets the same
tests again in the dispatcher (so it is refused later only if the queues filled
meanwhile).

It is used only where nothing else must see the request first: no API keys (a caller
without a key must get 401, not learn about the model), no CORS, access log or tracing
middleware (``server.py`` decides). Rate limits and pipelines are left to the usual path.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote

from inferpool.engine.client import EngineClient
from inferpool.engine.ipc.messages import Kind
from inferpool.errors import BadRequest, Overloaded
from inferpool.frontends.metrics_server import OVERLOAD, count_rejected
from inferpool.frontends.request_context import HEADER_BYTES, from_header, generate
from inferpool.frontends.rest.answer import retry_line
from inferpool.frontends.rest.infer import infer_target

_PREFIX = b"/v2/models/"
# Request targets remembered by ``HeaderAdmission`` (forgotten all at once past this).
TARGETS_KEPT = 1024

# An early refusal: status, message, extra header lines (Retry-After, x-request-id).
Refusal = tuple[int, str, bytes]
# (url, headers) -> the refusal of the request now, or None (``http1.py`` asks).
Admission = Callable[[bytes, list[tuple[bytes, bytes]]], Refusal | None]
# A refused request's body up to this size is skipped through the parser (never held) and
# the connection kept: a new connection per refusal costs the frontend more than the body
# (RESULTS.md, 2026-12-07). Larger, chunked, or behind 100-continue: answered with
# ``Connection: close``, the body dropped unread for a moment, then the connection closed.
SKIP_BYTES = 1 << 20


def skips(length: bytes | None, expects_continue: bool, keep_alive: bool) -> bool:
    """Whether a refused request's body is skipped on a kept connection (else closed).
    ``keep_alive``: the client keeps it and reads its answers (a peer that does not would
    pile up refusals in the transport: closed instead)."""
    return keep_alive and not expects_continue and length is not None and int(length) <= SKIP_BYTES


class HeaderAdmission:
    """``(url, headers) -> Refusal | None`` for the HTTP/1.1 protocol, over one client."""

    def __init__(self, client: EngineClient) -> None:
        self.refusal = client.inference.refusal
        # Request targets already read (a client sends the same few again and again):
        # a dict look-up instead of a decode and a split per request; bounded.
        self.targets: dict[bytes, tuple[str, str | None] | None] = {}

    def __call__(self, url: bytes, headers: list[tuple[bytes, bytes]]) -> Refusal | None:
        if not url.startswith(_PREFIX):
            return None
        try:
            target = self.targets[url]
        except KeyError:
            target = self._read(url)
        if target is None:
            return None
        refused = self.refusal(target[0], target[1], Kind.REST)
        if refused is None:
            return None
        lines = b""
        if refused.retry_after:
            if isinstance(refused, Overloaded):
                count_rejected("rest", OVERLOAD)
            lines = retry_line(refused.retry_seconds)
        return refused.status, refused.message, lines + _id_line(headers)

    def _read(self, url: bytes) -> tuple[str, str | None] | None:
        """The infer target of a request target (its query left out), remembered."""
        path = url.split(b"?", 1)[0].decode("latin-1")
        if "%" in path:  # as Uvicorn reads it for the app's ``path``
            path = unquote(path)
        target = infer_target(path, "") if path.endswith("/infer") else None
        if len(self.targets) >= TARGETS_KEPT:
            self.targets.clear()
        self.targets[url] = target
        return target


def _id_line(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The request id line the answer carries: the client's own, else (absent, or not an
    id the server takes) a new one."""
    request_id = None
    for name, value in headers:
        if name == HEADER_BYTES:
            try:
                request_id = from_header(value)
            except BadRequest:
                request_id = None
    return HEADER_BYTES + b": " + (request_id or generate()).encode() + b"\r\n"


def header_admission(
    client: EngineClient, middleware: bool, keys: object | None
) -> HeaderAdmission | None:
    """The check for ``http1.py``, or None where something must see the request first:
    API keys (``keys``), or a middleware (CORS, access log, spans: ``middleware``)."""
    if keys is not None or middleware:
        return None
    return HeaderAdmission(client)
