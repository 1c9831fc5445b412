"""The HTTP/2 wire vocabulary (RFC 9113, RFC 7541): the connection's and its users'.

It owns what the bytes on the wire mean, and nothing of a connection's state: the
connection preface; frame types, flags, error codes and SETTINGS identifiers; the windows
and frame sizes we advertise and the per-second budgets past which a connection ends with
GOAWAY ENHANCE_YOUR_CALM; the frame-header and SETTINGS structs; ``Limits``, what one
connection may cost; ``ProtocolFailure``, a connection-level error; framing (``frame``),
padding (``unpad``); request header validation (``validate_headers``); and the HPACK
encoding of responses (``hpack_int``, ``literal``, ``literal_indexed_name``: no dynamic
table, so header blocks can be precomputed, as ``frontends/grpc/h2.py`` does). The
connection itself is ``http2.py``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# Error codes.
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = (
    0x5, 0x6, 0x7, 0x8, 0x9,
)  # fmt: skip
ENHANCE_YOUR_CALM = 0xB
# Every code of RFC 9113 §7 by name (the metrics label GOAWAYs sent with it).
_CODE_NAMES = """NO_ERROR PROTOCOL_ERROR INTERNAL_ERROR FLOW_CONTROL_ERROR SETTINGS_TIMEOUT
STREAM_CLOSED FRAME_SIZE_ERROR REFUSED_STREAM CANCEL COMPRESSION_ERROR CONNECT_ERROR
ENHANCE_YOUR_CALM INADEQUATE_SECURITY HTTP_1_1_REQUIRED"""
ERROR_CODE_NAMES = dict(enumerate(_CODE_NAMES.split()))

# SETTINGS identifiers.
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1
# What a peer may send before we acknowledge it. Windows are given back only as bodies
# are consumed (handed to the call), so a connection can make us hold at most
# max_body + CONNECTION_WINDOW of request bodies; 1 MiB per stream still lets a 64 MiB
# tensor stream through with a WINDOW_UPDATE every 256 KiB.
STREAM_WINDOW = 1024 * 1024
CONNECTION_WINDOW = 4 * 1024 * 1024
RECEIVE_FRAME = 256 * 1024
HEADER_TABLE_SIZE = 4096
# Budgets per connection and per second (the timer refills them): past one, GOAWAY
# ENHANCE_YOUR_CALM. Generous for real clients (grpc's BDP and keepalive pings are a few
# a second), tiny against floods (CVE-2019-9512/9514/9515/9518, CVE-2023-44487).
PING_BUDGET = 1000
SETTINGS_BUDGET = 100
PRIORITY_BUDGET = 1000
# RST_STREAM received, plus streams we reset or refused: a client cancelling calls under
# overload stays well below; a rapid reset (CVE-2023-44487) goes far past it.
RESET_BUDGET = 1000
EMPTY_BUDGET = 100  # DATA, HEADERS or CONTINUATION frames that carry nothing and end nothing
CONTINUATION_LIMIT = 256  # CONTINUATION frames in one header block

FRAME_HEAD = struct.Struct(">HBBBI")  # 24-bit length as (high 16, low 8), type, flags, id
SETTING = struct.Struct(">HI")
U32 = struct.Struct(">I")

_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
_REQUIRED = (b":method", b":scheme", b":path")
_CONNECTION_SPECIFIC = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)


@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection may cost; ``from_settings`` maps the server settings."""

    max_body: int = 64 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    max_header_count: int = 100
    max_streams: int = 256
    handshake_timeout: float = 10.0
    idle_timeout: float = 60.0
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    write_timeout: float = 30.0

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        return cls(
            max_body=settings.max_body_bytes,
            max_header_bytes=settings.max_header_bytes,
            max_header_count=settings.max_header_count,
            max_streams=settings.max_concurrent_streams,
            handshake_timeout=settings.handshake_timeout,
            idle_timeout=settings.idle_timeout,
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            write_timeout=settings.write_timeout,
        )

    @property
    def tick(self) -> float:
        """Seconds between two checks of the connection's timers."""
        timeouts = [
            t
            for t in (
                self.handshake_timeout,
                self.idle_timeout,
                self.header_timeout,
                self.body_timeout,
                self.write_timeout,
            )
            if t > 0
        ]
        return max(0.05, min([1.0, *(t / 4 for t in timeouts)]))


DEFAULT_LIMITS = Limits()


class ProtocolFailure(Exception):
    """A connection-level protocol error: the connection ends with GOAWAY(code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return FRAME_HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def frame_head(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    """A frame's 9-byte head alone, for a payload written apart from it."""
    return FRAME_HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) with ``first``'s high bits set in its first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, new name, no Huffman (RFC 7541 §6.2.2)."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def literal_indexed_name(index: int, value: bytes) -> bytes:
    """A literal header field without indexing whose name is a static-table entry."""
    return hpack_int(index, 4) + hpack_int(len(value), 7) + value


def unpad(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolFailure(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]


def validate_headers(headers: list[tuple[bytes, bytes]]) -> tuple[str | None, int, int | None]:
    """What is wrong with a request's header list (RFC 9113 §8.1.1, §8.2, §8.3), its size
    as SETTINGS_MAX_HEADER_LIST_SIZE counts it, and its content-length."""
    size = 0
    regular = False
    pseudo: set[bytes] = set()
    length: int | None = None
    problem: str | None = None
    for name, value in headers:
        size += len(name) + len(value) + 32
        if problem is not None:
            continue
        if name[:1] == b":":
            if regular:
                problem = "pseudo-header after a regular header"
            elif name not in _PSEUDO or name in pseudo:
                problem = "unknown or repeated pseudo-header"
            pseudo.add(name)
            continue
        regular = True
        if name != name.lower():
            problem = "uppercase header name"
        elif name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
            problem = "connection-specific header"
        elif name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                problem = "bad content-length"
            else:
                length = int(value)
    if problem is None and not all(required in pseudo for required in _REQUIRED):
        problem = "missing :method, :scheme or :path"
    if problem is None and not dict(headers).get(b":path"):
        problem = "empty :path"
    return problem, size, length
