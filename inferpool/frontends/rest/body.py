"""What a REST request brings besides its URL: body (bounded, decompressed from gzip or
deflate), binary header length, timeout, request id.

``read_request`` reads all of them for the infer and custom endpoint routes; the engine's
reply is awaited in ``reply.py``.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import Receive

from inferpool.errors import BadRequest, ClientGone, InferpoolError, TooLarge
from inferpool.frontends.rest.ids import take_header_id
from inferpool.protocol.priority import HEADER, header_level
from inferpool.settings import ServerSettings

logger = logging.getLogger("inferpool.http")

# The scope key of the level a request's inferpool-priority header asks for (its absence:
# none), and the header's name.
PRIORITY = "inferpool.priority"
_PRIORITY = HEADER.encode()
# Request-Timeout values beyond this many seconds (about 3 years) mean no deadline; the
# worker's slot header holds a deadline in int64 nanoseconds.
MAX_TIMEOUT = 1e8

# Content-Encoding → zlib's wbits: gzip's header and trailer, or zlib's (HTTP's "deflate").
ENCODINGS = {
    b"gzip": 16 + zlib.MAX_WBITS,
    b"x-gzip": 16 + zlib.MAX_WBITS,
    b"deflate": zlib.MAX_WBITS,
}


class UnsupportedEncoding(InferpoolError):
    """A request body in a Content-Encoding the server cannot decode."""

    status = 415


class BodyTooLarge(TooLarge):
    """A request body over its limit (``max_body_bytes``), refused before it is decoded."""


def too_large_message(size: int | str, limit: int) -> str:
    return f"request body of {size} bytes exceeds the limit of {limit} bytes (--max-body-bytes)"


def headers_refusal(settings: ServerSettings, count: int) -> tuple[str, str]:
    """The message of request headers over a limit, and the limit's setting: their count
    (``count`` fields) if over, else their size."""
    if count > settings.max_header_count:
        limit = f"{settings.max_header_count} fields (--max-header-count)"
        return f"request headers exceed the limit of {limit}", "max_header_count"
    limit = f"{settings.max_header_bytes} bytes (--max-header-bytes)"
    return f"request headers exceed the limit of {limit}", "max_header_bytes"


_Header = bytes | None
# Six, named by scan_headers; fixed, so that a caller unpacking five fails the type check.
ScannedHeaders = tuple[_Header, _Header, _Header, _Header, _Header, _Header]


def scan_headers(headers: list[tuple[bytes, bytes]]) -> ScannedHeaders:
    """Content-Length, Inference-Header-Content-Length, Request-Timeout, Content-Encoding,
    X-Request-Id and inferpool-priority, in one pass.

    Both servers hand header names over lower-cased.
    """
    content_length = binary = timeout = encoding = request_id = priority = None
    for name, value in headers:
        if name == b"content-length":
            content_length = value
        elif name == b"inference-header-content-length":
            binary = value
        elif name == b"request-timeout":
            timeout = value
        elif name == b"content-encoding":
            encoding = value
        elif name == b"x-request-id":
            request_id = value
        elif name == _PRIORITY:
            priority = value
    return content_length, binary, timeout, encoding, request_id, priority


# A body declared at least this large is read into one buffer of its Content-Length;
# a smaller one keeps the hot path of small requests as it is (its chunks joined).
LARGE_BODY = 1 << 20


async def read_body(
    receive: Receive,
    content_length: bytes | None,
    limit: int,
    encoding: bytes | None = None,
    prefix: bytes = b"",
) -> bytes:
    """``prefix`` then the whole body, refused (413) from its Content-Length or once it
    grows past ``limit`` (which counts the body only).

    A body with a Content-Length of ``LARGE_BODY`` or more is read into one buffer of that
    size (a bytearray, behind ``prefix``): one copy of it, where chunks joined made two.
    A body with a Content-Encoding is decompressed as it arrives; ``limit`` then bounds the
    decompressed size as well, so a small bomb is refused after at most ``limit`` bytes.
    """
    if encoding is not None:
        inflated = await _read_encoded(receive, content_length, limit, encoding)
        return prefix + inflated if prefix else inflated
    declared = _check_length(content_length, limit)
    message = await receive()
    if message["type"] != "http.request":
        raise client_gone("while its body was arriving")
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise BodyTooLarge(too_large_message(len(body), limit))
        return prefix + body if prefix else body
    if declared is not None and declared >= LARGE_BODY:
        return await _read_into_buffer(receive, body, declared, limit, prefix)
    chunks = [prefix, body] if prefix else [body]
    async for chunk in _next_chunks(receive, len(body), limit):
        chunks.append(chunk)
    return b"".join(chunks)


# The boundary a large body's first binary tensor is put on (``alignment``): large
# buffers from malloc, and bytes' data, start on one, so the decoder's view of the tensor
# is aligned and is not copied to be.
ALIGN = 16


def alignment(before: int, binary: bytes | None) -> int:
    """Bytes of padding that put the first binary tensor of a body (its JSON header
    ``binary`` bytes long: Inference-Header-Content-Length) read behind ``before`` bytes at
    an ``ALIGN`` boundary; 0 without a valid binary header. Whitespace pads it (JSON
    allows it around the document); the caller checks the body is large first."""
    text = b"" if binary is None else binary.strip()
    if not (0 < len(text) <= 18 and text.isdigit()):
        return 0
    return -(before + int(text)) % ALIGN


async def _read_into_buffer(
    receive: Receive, first: bytes, declared: int, limit: int, prefix: bytes
) -> bytes:
    """``prefix`` and the body (``first`` the chunk already received) in one bytearray
    sized from the Content-Length; the servers enforce the framing, so the chunks fill it
    exactly (a body that ends short is cut to what came)."""
    buffer = bytearray(len(prefix) + declared)
    view = memoryview(buffer)
    view[: len(prefix)] = prefix
    at = len(prefix)
    try:
        at = _fill(view, at, first)
        async for chunk in _next_chunks(receive, len(first), limit):
            at = _fill(view, at, chunk)
    finally:
        view.release()
    if at < len(buffer):
        del buffer[at:]
    # A bytes-like that every reader of a body takes as bytes (the decoders, writev, ``in``).
    return buffer  # type: ignore[return-value]


def _fill(view: memoryview, at: int, chunk: bytes) -> int:
    """``chunk`` copied into ``view`` at ``at``; where the next one goes."""
    end = at + len(chunk)
    if end > len(view):
        raise BadRequest("request body is longer than its Content-Length")
    view[at:end] = chunk
    return end


async def _next_chunks(receive: Receive, received: int, limit: int) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive, to the last; 413 once more than ``limit`` bytes
    came in all (``received`` of them before these)."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise client_gone("while its body was arriving")
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise BodyTooLarge(too_large_message(f"more than {limit}", limit))
        yield chunk
        if not message.get("more_body", False):
            return


async def _read_encoded(
    receive: Receive, content_length: bytes | None, limit: int, encoding: bytes
) -> bytes:
    """The decompressed body; 415 for an encoding we lack, 400 for a corrupt stream."""
    token = encoding.strip().lower()
    if token == b"identity":
        return await read_body(receive, content_length, limit)
    wbits = ENCODINGS.get(token)
    if wbits is None:
        shown = encoding[:40].decode("latin-1")
        raise UnsupportedEncoding(
            f"Content-Encoding {shown!r} is not supported; use gzip, deflate or identity"
        )
    _check_length(content_length, limit)
    inflater = _Inflater(token.decode(), wbits, limit)
    # Each chunk inflated as it arrives: neither side is ever held past the limit.
    async for chunk in _next_chunks(receive, 0, limit):
        inflater.feed(chunk)
    return inflater.finish()


class _Inflater:
    """gzip (several members, as ``gzip.decompress`` reads them) or deflate, bounded."""

    def __init__(self, name: str, wbits: int, limit: int) -> None:
        self.name = name
        self.wbits = wbits
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.stream = zlib.decompressobj(wbits)

    def feed(self, data: bytes) -> None:
        try:
            while data:
                room = self.limit - self.size + 1  # one byte over proves the limit passed
                part = self.stream.decompress(data, room)
                self._keep(part)
                data = self.stream.unconsumed_tail
                if self.stream.eof:
                    data = self._next_member(data + self.stream.unused_data)
        except zlib.error as exc:
            raise BadRequest(f"request body is not valid {self.name} data ({exc})") from None

    def _next_member(self, rest: bytes) -> bytes:
        if not rest or self.wbits != ENCODINGS[b"gzip"]:
            if rest:
                raise BadRequest(f"request body has data after the end of its {self.name} stream")
            return rest
        self.stream = zlib.decompressobj(self.wbits)
        return rest

    def _keep(self, part: bytes) -> None:
        self.size += len(part)
        if self.size > self.limit:
            raise TooLarge(
                f"decompressed request body exceeds the limit of {self.limit} bytes "
                "(--max-body-bytes)"
            )
        if part:
            self.parts.append(part)

    def finish(self) -> bytes:
        if not self.stream.eof:
            raise BadRequest(f"request body ends inside its {self.name} stream (truncated)")
        return b"".join(self.parts)


def _check_length(content_length: bytes | None, limit: int) -> int | None:
    """The declared length (None: none, or not a number); 413 when over ``limit``."""
    if content_length is None:
        return None
    text = content_length.strip()
    declared = int(text) if text.isdigit() and len(text) <= 18 else None
    if len(text) > 18 or (declared is not None and declared > limit):
        raise BodyTooLarge(too_large_message(text.decode("latin-1")[:40], limit))
    return declared


def json_length(raw: bytes | None, body_size: int) -> int | None:
    """Inference-Header-Content-Length: a non-negative integer no larger than the body."""
    if raw is None:
        return None
    text = raw.strip()
    if not (0 < len(text) <= 19 and text.isdigit()):
        shown = raw[:40].decode("latin-1")
        raise BadRequest(
            f"Inference-Header-Content-Length must be a non-negative integer, got {shown!r}"
        )
    length = int(text)
    if length > body_size:
        raise BadRequest(
            f"Inference-Header-Content-Length {length} is larger than the request body "
            f"({body_size} bytes)"
        )
    return length


def request_timeout(raw: bytes | None, default: float) -> float | None:
    """Seconds from the Request-Timeout header, else ``default`` if > 0; None: no deadline."""
    if raw is None:
        return default if default > 0 else None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:  # also NaN
        shown = raw[:40].decode("latin-1")
        raise BadRequest(f"Request-Timeout must be a number of seconds > 0, got {shown!r}")
    return seconds if seconds <= MAX_TIMEOUT else None


def client_gone(when: str) -> ClientGone:
    """The error of a request whose client went away ``when``."""
    logger.debug("client went away %s", when)
    return ClientGone(f"the client went away {when}")


def read_head(
    scope: Any, default_timeout: float
) -> tuple[bytes | None, bytes | None, float | None, bytes | None]:
    """What a request's headers say before its body is read: its Content-Length,
    Inference-Header-Content-Length, timeout in seconds (None: no deadline) and
    Content-Encoding; its request id taken from its header first and its
    ``inferpool-priority`` level into the scope (``PRIORITY``; 400 for a bad one)."""
    content_length, binary, timeout_header, encoding, given, priority = scan_headers(
        scope["headers"]
    )
    take_header_id(scope, given)
    timeout = request_timeout(timeout_header, default_timeout)
    if priority is not None:  # the infer route hands it to the dispatcher (``LEVEL``)
        scope[PRIORITY] = header_level(priority)
    return content_length, binary, timeout, encoding


async def read_request(
    scope: Any, receive: Any, limit: int, default_timeout: float
) -> tuple[bytes, bytes | None, float | None]:
    """A request's body (``read_body``: at most ``limit`` bytes), its
    Inference-Header-Content-Length and its timeout (``read_head``): what the custom
    endpoint routes read before they call the engine."""
    content_length, binary, timeout, encoding = read_head(scope, default_timeout)
    body = await read_body(receive, content_length, limit, encoding)
    return body, binary, timeout
