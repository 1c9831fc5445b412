"""Admission from a ModelInfer call's first bytes, for the builtin HTTP/2 server.

gRPC carries the model's name inside the protobuf message, not in a header: the earliest
the name can be known is the body's first DATA frame. Protobuf serializers write fields
in field-number order, so a ModelInferRequest begins with ``model_name`` (1) and
``model_version`` (2), ahead of its tensors. ``CallAdmission`` peeks at them in that
first payload (no decoding beyond two length-prefixed strings) and, when the request
would be refused now (model unknown, not READY, every queue full: the engine's
``Inference.refusal``, as REST's ``rest/early.py``), answers trailers-only at once: the
rest of the body is dropped unread (RST_STREAM NO_ERROR), never buffered.

When the first payload holds the whole message, or cannot tell (a compressed message, a
name split across frames, fields in another order), the call is read whole and routed as
before: a small message's refusal there costs no more, and admitted calls skip the
check. A message that repeats ``model_name`` later is refused by its first name here
(protobuf's "last one wins" applies only on the usual path); no client library writes
one.
"""

from __future__ import annotations

from inferpool.engine.client import EngineClient
from inferpool.engine.ipc.messages import Kind
from inferpool.errors import BadRequest, Overloaded
from inferpool.frontends.grpc.h2_call import REQUEST_ID, RESPONSE_HEADERS, status_trailers
from inferpool.frontends.grpc.service import SERVICE
from inferpool.frontends.metrics_server import OVERLOAD, count_rejected
from inferpool.frontends.request_context import checked, generate
from inferpool.transport.http2_streams import Stream
from inferpool.transport.http2_wire import literal

_NAME = 0x0A  # field 1 (model_name), length-delimited
_VERSION = 0x12  # field 2 (model_version), length-delimited


def _string(data: bytes, at: int) -> tuple[bytes, int] | None:
    """A length-delimited value starting at ``at`` (its varint length first), and where
    the next field starts; None if ``data`` ends before it does."""
    length = shift = 0
    while True:
        if at >= len(data) or shift > 28:
            return None
        byte = data[at]
        at += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    end = at + length
    return (data[at:end], end) if end <= len(data) else None


def peek_route(payload: bytes) -> tuple[str, str | None] | None:
    """``(model_name, model_version)`` from the start of a gRPC message (its 5-byte
    prefix first), or None when the start does not tell."""
    if len(payload) < 7 or payload[0] != 0 or payload[5] != _NAME:
        return None  # compressed, too short, or not field 1 first
    name = _string(payload, 6)
    if name is None or not name[0]:
        return None
    raw, at = name
    version = None
    if at < len(payload) and payload[at] == _VERSION:
        found = _string(payload, at + 1)
        if found is None:
            return None
        version = found[0] or None
    elif at >= len(payload) and at - 5 < int.from_bytes(payload[1:5], "big"):
        return None  # the message goes on where this payload ends: a version may follow
    try:
        return raw.decode(), None if version is None else version.decode()
    except UnicodeDecodeError:
        return None


class CallAdmission:
    """``(stream, first payload) -> header block | None`` for ``Http2Connection``."""

    def __init__(self, client: EngineClient, path: bytes) -> None:
        self.client = client
        self.path = path  # ModelInfer's

    def __call__(self, stream: Stream, payload: bytes) -> bytes | None:
        # A message whole in its first DATA frame (every small request) has nothing left
        # to drop unread: the usual path refuses it just as well, and an admitted one (the
        # common case) is not asked about twice (the same check from REST's headers
        # measured 1.0-1.2 µs: benchmarks/RESULTS.md, 2026-12-07 01:41).
        if len(payload) >= 5 and len(payload) - 5 >= int.from_bytes(payload[1:5], "big"):
            return None
        if path_of(stream.headers) != self.path:
            return None
        route = peek_route(payload)
        if route is None:
            return None
        refused = self.client.inference.refusal(route[0], route[1], Kind.GRPC)
        if refused is None:
            return None
        pushback = 0
        if refused.retry_after:
            if isinstance(refused, Overloaded):
                count_rejected("grpc", OVERLOAD)
            pushback = refused.retry_seconds * 1000
        trailers = status_trailers(refused.grpc_code, refused.message, pushback)
        return RESPONSE_HEADERS + trailers + literal(REQUEST_ID, _request_id(stream))


def path_of(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A request's ``:path`` (a pseudo-header: among the first few)."""
    for name, value in headers:
        if name == b":path":
            return value
    return b""


def _request_id(stream: Stream) -> bytes:
    """The call's x-request-id if it sent a usable one, else a new one."""
    for name, value in stream.headers:
        if name == REQUEST_ID:
            try:
                return checked(value.decode("latin-1")).encode()
            except BadRequest:
                break
    return generate().encode()


def call_admission(
    client: EngineClient, keys: object | None, observed: bool
) -> CallAdmission | None:
    """The check for the builtin HTTP/2 server, or None where something must see the call
    first: API keys (``keys``), the access log or spans (``observed``)."""
    if keys is not None or observed:
        return None
    return CallAdmission(client, f"/{SERVICE}/ModelInfer".encode())
