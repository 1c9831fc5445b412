"""gRPC message compression on the builtin HTTP/2 server.

Requests: a message whose compressed flag is set is inflated by its call's
``grpc-encoding`` (gzip, or deflate: zlib's format), its inflated size bounded by the
message limit; a flagged message without an encoding is INTERNAL, an encoding not served
UNIMPLEMENTED, as gRPC's PROTOCOL-HTTP2.md says. Responses (``grpc_response_gzip``, off
by default as in Triton and MLServer: grpcio clients list gzip on every call, and tensors
barely compress): when the client's ``grpc-accept-encoding`` lists gzip and the settings
are on, a response message of at least
``gzip_min_bytes`` goes out gzipped (flag 1, ``grpc-encoding: gzip`` in the response
headers, which also advertise ``grpc-accept-encoding``); smaller ones stay identity.

The grpc.aio server (``aio.py``) reads compressed requests itself (grpcio's core) and
compresses responses by the same rule through grpcio's options (``aio_gzip.py``).
"""

from __future__ import annotations

import zlib

from inferpool.frontends.gzip_codec import gzipped
from inferpool.settings import ServerSettings
from inferpool.transport.http2_wire import literal

# grpc-encoding → zlib's wbits.
_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
ACCEPTED = b"identity,deflate,gzip"
# Response header lines (HPACK literals) of a call whose messages go out gzipped.
GZIP_HEADERS = literal(b"grpc-encoding", b"gzip") + literal(b"grpc-accept-encoding", ACCEPTED)


class BadMessage(Exception):
    """A request message that cannot be read, with the gRPC status it gets."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def inflate(payload: bytes, encoding: bytes | None, limit: int) -> bytes:
    """A compressed message's bytes, by its call's ``grpc-encoding`` (at most ``limit``)."""
    if encoding is None or encoding == b"identity":
        raise BadMessage(
            "INTERNAL", "the message is flagged compressed but the call names no grpc-encoding"
        )
    wbits = _WBITS.get(encoding)
    if wbits is None:
        shown = encoding.decode("latin-1")
        raise BadMessage(
            "UNIMPLEMENTED", f"grpc-encoding {shown!r} is not supported; use gzip or identity"
        )
    inflater = zlib.decompressobj(wbits)
    try:
        message = inflater.decompress(payload, limit + 1)
    except zlib.error:
        raise BadMessage("INTERNAL", f"the {encoding.decode()} message is corrupt") from None
    if len(message) > limit:
        raise BadMessage(
            "RESOURCE_EXHAUSTED",
            f"the inflated message is over the limit of {limit} bytes (max_body_bytes)",
        )
    if not inflater.eof or inflater.unused_data:
        raise BadMessage("INTERNAL", f"the {encoding.decode()} message is truncated or corrupt")
    return message


def accepts_gzip(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a call's ``grpc-accept-encoding`` lists gzip."""
    for name, value in headers:
        if name == b"grpc-accept-encoding":
            return b"gzip" in (coding.strip() for coding in value.lower().split(b","))
    return False


class ResponseGzip:
    """The builtin server's response compression; ``None`` stands for the setting off."""

    def __init__(self, settings: ServerSettings) -> None:
        self.min_bytes = settings.gzip_min_bytes
        self.level = settings.gzip_level

    def framed(self, headers: list[tuple[bytes, bytes]], message: bytes) -> bytes | None:
        """The gzipped, length-prefixed message when the call accepts gzip and it is large
        enough; None: send it as identity."""
        if len(message) < self.min_bytes or not accepts_gzip(headers):
            return None
        compressed = gzipped(message, self.level)
        return b"\x01" + len(compressed).to_bytes(4, "big") + compressed


def response_gzip(settings: ServerSettings) -> ResponseGzip | None:
    return ResponseGzip(settings) if compresses_grpc(settings) else None


def compresses_grpc(settings: ServerSettings) -> bool:
    """Whether gRPC response messages are gzipped for clients that accept it."""
    return settings.gzip_enabled and settings.grpc_response_gzip
