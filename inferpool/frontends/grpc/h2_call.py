"""What gRPC adds to one HTTP/2 stream, for inferpool's own server (``h2.py``,
``h2_stream.py``): the response headers and trailers (``grpc-status``, ``grpc-message``,
``grpc-retry-pushback-ms``, ModelInfer's ``x-request-id``), ``grpc-timeout``, the 5-byte
length-prefixed message, the part of grpc.aio's ServicerContext typed handlers use; and
the status a call ends with when an exception, its deadline, its client or the shutdown
ended it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import quote

from inferpool.frontends.grpc.compression import GZIP_HEADERS, BadMessage, ResponseGzip, inflate
from inferpool.frontends.grpc.service import call_status
from inferpool.frontends.request_context import HEADER
from inferpool.transport.http2 import Http2Connection
from inferpool.transport.http2_streams import REFUSED, Stream
from inferpool.transport.http2_wire import literal, literal_indexed_name
from inferpool.transport.unsent import ANSWERS, SMALL

# gRPC status codes (grpc/doc/statuscodes.md).
STATUS = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}  # fmt: skip

# Response headers: ":status: 200" is static-table entry 8, "content-type" entry 31.
GRPC_CONTENT_TYPE = b"application/grpc"
RESPONSE_HEADERS = b"\x88" + literal_indexed_name(31, GRPC_CONTENT_TYPE)
OK_TRAILERS = literal(b"grpc-status", b"0")
REQUEST_ID = HEADER.encode()
# OK_TRAILERS and the x-request-id literal's name: only the value's length and bytes follow.
_OK_AND_ID = OK_TRAILERS + literal(REQUEST_ID, b"")[:-1]
NOT_GRPC_HEADERS = literal_indexed_name(8, b"415")  # ":status: 415"
# grpc-timeout units (PROTOCOL-HTTP2.md) in seconds.
_TIMEOUT_UNITS = {
    ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0,
    ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9,
}  # fmt: skip
# A longer grpc-timeout (grpc-go sends up to 2562047H, ~292 years) means "no deadline" in
# practice; clamped, so that the deadline always fits the worker slot header.
MAX_TIMEOUT = 365 * 24 * 3600.0
# Largest message when no limit is given (gRPC's own ceiling).
MESSAGE_CEILING = 2**31 - 1


class CallError(Exception):
    """A call that ends with a non-OK status before reaching the service."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status_trailers(code: str, message: str = "", pushback: int = 0) -> bytes:
    """Trailers carrying a status; the message percent-encoded as gRPC requires."""
    block = literal(b"grpc-status", str(STATUS[code]).encode())
    if message:
        encoded = quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode()
        block += literal(b"grpc-message", encoded)
    if pushback:  # milliseconds (``call_status``)
        block += literal(b"grpc-retry-pushback-ms", str(pushback).encode())
    return block


def parse_timeout(value: bytes) -> float:
    """A ``grpc-timeout`` value (up to 8 digits and a unit) in seconds, at most a year."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        raise CallError("INTERNAL", f"malformed grpc-timeout {value.decode(errors='replace')!r}")
    unit = _TIMEOUT_UNITS.get(value[-1])
    if unit is None:
        raise CallError("INTERNAL", f"malformed grpc-timeout {value.decode(errors='replace')!r}")
    return min(int(value[:-1]) * unit, MAX_TIMEOUT)


def too_large(length: int, limit: int) -> str:
    return f"message of {length} bytes is over the limit of {limit} bytes (max_body_bytes)"


def unframe(
    chunks: list[bytes], limit: int = MESSAGE_CEILING, encoding: bytes | None = None
) -> bytes:
    """The one message of a unary call from its length-prefixed DATA, inflated by the
    call's ``grpc-encoding`` when flagged compressed (``compression.inflate``)."""
    size = len(chunks[0]) if len(chunks) == 1 else sum(len(chunk) for chunk in chunks)
    large = len(chunks) > 1 and size >= LARGE_MESSAGE
    # A large message's first bytes only, for its prefix; it is copied once, below.
    body = chunks[0] if len(chunks) == 1 else _prefix(chunks) if large else b"".join(chunks)
    if size < 5 or len(body) < 5:
        raise CallError("INTERNAL", "a unary call needs exactly one request message")
    flag = body[0]
    if flag > 1:
        raise CallError("INTERNAL", f"invalid compressed flag {flag} of the message prefix")
    length = int.from_bytes(body[1:5], "big")
    if length > limit:
        raise CallError("RESOURCE_EXHAUSTED", too_large(length, limit))
    if size != 5 + length:
        raise CallError("INTERNAL", "a unary call needs exactly one request message")
    if large:
        body = _after_prefix(chunks)
        if flag == 0:
            return body
        return _inflated(body, encoding, limit)
    if flag == 0:
        return body[5:]
    return _inflated(body[5:], encoding, limit)


def _inflated(message: bytes, encoding: bytes | None, limit: int) -> bytes:
    try:
        return inflate(message, encoding, limit)
    except BadMessage as exc:
        raise CallError(exc.code, exc.message) from None


# A message of this size or more in several DATA chunks is copied once into its own
# buffer behind its 5-byte prefix (``_after_prefix``), not joined then sliced (twice).
LARGE_MESSAGE = 1 << 20


def _prefix(chunks: list[bytes]) -> bytes:
    """The message's first 5 bytes (its compressed flag and length), however chunked."""
    head = b""
    for chunk in chunks:
        head += chunk[: 5 - len(head)]
        if len(head) == 5:
            break
    return head


def _after_prefix(chunks: list[bytes]) -> bytes:
    """The chunks' bytes after the message's 5-byte prefix, in one bytearray."""
    buffer = bytearray(sum(len(chunk) for chunk in chunks) - 5)
    at, skip = 0, 5
    for chunk in chunks:
        part = memoryview(chunk)[skip:] if skip else chunk
        skip = max(0, skip - len(chunk))
        buffer[at : at + len(part)] = part
        at += len(part)
    # A bytes-like that every reader of a message takes as bytes (protobuf, ``in``, writev).
    return buffer  # type: ignore[return-value]


def ok_trailers(request_id: bytes) -> bytes:
    """OK trailers with the call's ``x-request-id``."""
    if len(request_id) < 0x7F:  # its length fits the literal's one-byte form
        return _OK_AND_ID + bytes((len(request_id),)) + request_id
    return OK_TRAILERS + literal(REQUEST_ID, request_id)


def is_grpc(headers: dict[bytes, bytes]) -> bool:
    """A gRPC request: POST, ``content-type: application/grpc`` (or ``+proto`` ...)."""
    content_type = headers.get(b"content-type", b"")
    subtype = content_type[len(GRPC_CONTENT_TYPE) : len(GRPC_CONTENT_TYPE) + 1]
    return (
        headers.get(b":method") == b"POST"
        and content_type.startswith(GRPC_CONTENT_TYPE)
        and subtype in (b"", b"+", b";")  # application/grpc-web is not gRPC
    )


def framed(message: bytes) -> bytes:
    return message_prefix(len(message)) + message


def answer_parts(
    gzip: ResponseGzip | None, headers: list[tuple[bytes, bytes]], body: bytes
) -> tuple[bytes, bytes, bytes]:
    """A call's OK answer as ``respond`` takes it: its HEADERS block, its DATA and the lead
    sent before that DATA. Gzipped and framed when the server compresses, the client
    accepts it and it is worth it; else framed; a large message (``LARGE_MESSAGE``) as it
    is, behind its prefix as the lead, so that it is sent from views of it, not copied."""
    if gzip is not None and len(body) >= gzip.min_bytes:
        data = gzip.framed(headers, body)
        if data is not None:
            return RESPONSE_HEADERS + GZIP_HEADERS, data, b""
    if len(body) >= LARGE_MESSAGE:
        return RESPONSE_HEADERS, body, message_prefix(len(body))
    return RESPONSE_HEADERS, framed(body), b""


def message_prefix(length: int) -> bytes:
    """The 5-byte prefix of an uncompressed message of ``length`` bytes (a large one's is
    sent apart from it: ``Http2Streams.respond``'s ``lead``)."""
    return b"\x00" + length.to_bytes(4, "big")


class HeadersContext:
    """The part of grpc.aio's ServicerContext that typed handlers use, over a call's
    HTTP/2 headers and deadline (the builtin implementation): ``invocation_metadata()``,
    ``time_remaining()``."""

    __slots__ = ("_expires", "_headers")

    def __init__(self, headers: list[tuple[bytes, bytes]], expires: float | None = None) -> None:
        self._headers = headers
        self._expires = expires

    def time_remaining(self) -> float | None:
        """Seconds until the call's deadline (``time.monotonic()``'s), None without one."""
        return None if self._expires is None else max(0.0, self._expires - time.monotonic())

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """Every header but the pseudo-headers, as (key, value) strings."""
        return tuple(
            (key.decode("latin-1"), value.decode("latin-1"))
            for key, value in self._headers
            if not key.startswith(b":")
        )


def held_back(connection: Http2Connection, size: int) -> None:
    """Raise RESOURCE_EXHAUSTED instead of keeping an answer of ``size`` bytes past a bound
    of the answers peers have not read yet (``transport/unsent.py``)."""
    if size >= SMALL:
        refusal = ANSWERS.refusal(connection, size)
        if refusal is not None:
            REFUSED[refusal[0]] += 1
            raise CallError("RESOURCE_EXHAUSTED", refusal[1])


class Expiry:
    """A unary call's deadline: a timer that cancels the call's task, and remembers that
    it fired (the loop's timers may fire a fraction of a millisecond before
    ``time.monotonic()`` reaches the deadline, so the clock alone cannot tell)."""

    __slots__ = ("expires", "fired", "task", "timer")

    def __init__(self, expires: float) -> None:
        task = asyncio.current_task()
        assert task is not None  # a coroutine run as a task (_on_request)
        self.task = task
        self.expires = expires
        self.fired = False
        self.timer = asyncio.get_running_loop().call_later(expires - time.monotonic(), self._fire)

    def _fire(self) -> None:
        self.fired = True
        self.task.cancel()

    def passed(self) -> bool:
        return self.fired or time.monotonic() >= self.expires


def parsed(name: str, request_type: Any, message: bytes) -> Any:
    """A typed call's request message; INTERNAL if it does not parse."""
    try:
        return request_type.FromString(message)
    except Exception:
        raise CallError("INTERNAL", f"cannot parse the {name} request") from None


def call_end(
    exc: BaseException, stream: Stream, method: str, expiry: Expiry | None = None
) -> tuple[str, str, int]:
    """The status a call ends with when ``exc`` ended it: (code name, message, pushback).
    A cancellation is the client's (CANCELLED: the caller re-raises it), the deadline's
    (``expiry``) or the shutdown's, whose grace period ended before the call did."""
    if isinstance(exc, asyncio.CancelledError):
        if stream.closed:  # the client cancelled the call or went away
            return "CANCELLED", "", 0
        if expiry is not None and expiry.passed():
            return "DEADLINE_EXCEEDED", "Deadline Exceeded", 0
        return "UNAVAILABLE", "the server is shutting down; retry the call", 0
    if isinstance(exc, CallError):
        return exc.code, exc.message, 0
    assert isinstance(exc, Exception)
    return call_status(exc, method)


def stream_status(exc: BaseException, stream: Stream, method: str) -> tuple[str, str, int]:
    """The status a streaming call (Watch, ModelStreamInfer) ends with when ``exc`` ended
    it (``call_end``); its deadline is an ``asyncio.timeout``: DEADLINE_EXCEEDED."""
    if isinstance(exc, TimeoutError):
        return "DEADLINE_EXCEEDED", "Deadline Exceeded", 0
    return call_end(exc, stream, method)
