"""A lean HTTP/2 server connection (RFC 9113) for request/response exchanges such as gRPC's.

It owns the wire: the preface, framing, SETTINGS, PING, GOAWAY, RST_STREAM, flow control
in both directions, CONTINUATION, padding, and HPACK decoding (the ``hpack`` library).
A stream whose request has ended (headers, body, END_STREAM) is handed to
``on_request``; the caller answers with ``respond``. Responses are encoded without the
dynamic table (static-table indexes and literals), so header blocks can be precomputed.

Why not grpcio or h2: on the 2-core benchmark machine a unary call costs about 400 µs of
CPU in grpc.aio (C-core hands each call between threads) and about the same in h2 (an
event object per frame); this module's framing costs under 100 µs (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable

import hpack
from hpack import HPACKError

logger = logging.getLogger(__name__)
# hpack logs every header it decodes at DEBUG: noise, and a cost per call at any level.
logging.getLogger("hpack").setLevel(logging.WARNING)

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

# SETTINGS identifiers.
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1
# What we let a peer send before we acknowledge: large, so big tensors flow without
# waiting on WINDOW_UPDATEs, and acknowledged once half of it is used.
RECEIVE_WINDOW = 16 * 1024 * 1024
RECEIVE_FRAME = 1024 * 1024
MAX_STREAMS = 1024
MAX_HEADER_BLOCK = 1024 * 1024

_FRAME_HEAD = struct.Struct(">HBBBI")  # 24-bit length as (high 16, low 8), type, flags, id
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")


class ProtocolFailure(Exception):
    """A connection-level protocol error: the connection ends with GOAWAY(code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return _FRAME_HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


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


class Stream:
    """One request/response exchange on a connection."""

    __slots__ = (
        "body",
        "closed",
        "ended",
        "headers",
        "id",
        "pending",
        "received",
        "send_window",
        "task",
        "trailers",
        "unacked",
    )  # fmt: skip

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.received = 0  # body bytes so far
        self.unacked = 0  # flow-controlled bytes not yet returned with WINDOW_UPDATE
        self.ended = False  # the peer sent END_STREAM
        self.send_window = send_window
        self.pending: memoryview | None = None  # response DATA waiting for window
        self.trailers = b""
        self.task: asyncio.Future | None = None  # whoever answers it; cancelled on reset
        self.closed = False


OnRequest = Callable[["Http2Connection", Stream], None]


class Http2Connection(asyncio.Protocol):
    """The server side of one HTTP/2 connection."""

    def __init__(
        self,
        on_request: OnRequest,
        on_close: Callable[[Http2Connection], None] | None = None,
        max_body: int = MAX_WINDOW,
    ) -> None:
        self.on_request = on_request
        self.on_close = on_close
        self.max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0
        self.going_away = False  # the peer sent GOAWAY
        self.going_away_sent = False  # we did: no new streams, close when the last ends
        self._partial: list[bytes] = []  # the start of a frame still arriving
        self._partial_bytes = 0
        self._needed = 0
        self._preface_seen = False
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_BLOCK
        # Decoded header blocks, each with the dynamic-table version it was decoded under.
        self._decoded: dict[bytes, tuple[int, list[tuple[bytes, bytes]]]] = {}
        self._table_version = 0
        self._continuing: Stream | None = None  # a header block waiting for CONTINUATION
        self._block: list[bytes] = []
        self._block_flags = 0
        self._send_window = DEFAULT_WINDOW
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._unacked = 0  # connection-level bytes received and not yet acknowledged
        self._blocked: dict[int, Stream] = {}  # streams with DATA waiting for window
        self.closed = asyncio.get_running_loop().create_future()

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        settings = b"".join(
            _SETTING.pack(key, value)
            for key, value in (
                (SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS),
                (SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW),
                (SETTINGS_MAX_FRAME_SIZE, RECEIVE_FRAME),
            )
        )
        window = _U32.pack(RECEIVE_WINDOW - DEFAULT_WINDOW)
        self.transport.write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, window))

    def connection_lost(self, exc: Exception | None) -> None:
        for stream in self.streams.values():
            self._abandon(stream)
        self.streams.clear()
        self._blocked.clear()
        if not self.closed.done():
            self.closed.set_result(None)
        if self.on_close is not None:
            self.on_close(self)

    def pause_writing(self) -> None:
        # The peer is not reading our replies: stop reading its requests until it does,
        # so a client that only sends cannot pile replies up in this process.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._partial:
            # Joined only once the frame being waited for is complete: a 1 MiB frame read
            # 64 KiB at a time is copied once, not sixteen times.
            self._partial.append(data)
            self._partial_bytes += len(data)
            if self._partial_bytes < self._needed:
                return
            data = b"".join(self._partial)
            self._partial.clear()
        if not self._preface_seen:
            if len(data) < len(PREFACE):
                if not PREFACE.startswith(data):
                    self._close_now()
                    return
                self._wait_for(data, len(PREFACE))
                return
            if not data.startswith(PREFACE):
                self._close_now()  # not HTTP/2 (an HTTP/1.1 client, say)
                return
            data = data[len(PREFACE) :]
            self._preface_seen = True
        out: list[bytes] = []
        pos, end = 0, len(data)
        try:
            while end - pos >= 9:
                high, low, kind, flags, stream_id = _FRAME_HEAD.unpack_from(data, pos)
                length = high << 8 | low
                if length > RECEIVE_FRAME:
                    raise ProtocolFailure(FRAME_SIZE_ERROR, "frame larger than advertised")
                if end - pos - 9 < length:
                    self._wait_for(data[pos:], 9 + length)
                    break
                payload = data[pos + 9 : pos + 9 + length]
                pos += 9 + length
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload, out)
        except ProtocolFailure as exc:
            self._fail(exc.code, str(exc), out)
            return
        if end - pos < 9 and pos < end:
            self._wait_for(data[pos:], 9)
        if self._unacked >= RECEIVE_WINDOW // 2:
            out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._unacked)))
            self._unacked = 0
        if out:
            self._write(b"".join(out))

    def _wait_for(self, head: bytes, needed: int) -> None:
        """Keep the start of an incomplete frame until ``needed`` bytes have arrived."""
        self._partial.append(head)
        self._partial_bytes = len(head)
        self._needed = needed

    # -- frames in -------------------------------------------------------------------------
    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes, out: list) -> None:
        if self._continuing is not None and kind != CONTINUATION:
            raise ProtocolFailure(PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == DATA:
            self._data(flags, stream_id, payload, out)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload, out)
        elif kind == CONTINUATION:
            stream = self._continuing
            if stream is None or stream.id != stream_id:
                raise ProtocolFailure(PROTOCOL_ERROR, "unexpected CONTINUATION")
            self._block.append(payload)
            if sum(map(len, self._block)) > MAX_HEADER_BLOCK:
                raise ProtocolFailure(COMPRESSION_ERROR, "header block too large")
            if flags & END_HEADERS:
                self._continuing = None
                self._headers_complete(stream, b"".join(self._block), self._block_flags, out)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload, out)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload, out)
        elif kind == PING:
            if len(payload) != 8 or stream_id:
                raise ProtocolFailure(PROTOCOL_ERROR, "bad PING")
            if not flags & ACK:
                out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            if stream_id == 0:
                raise ProtocolFailure(PROTOCOL_ERROR, "RST_STREAM on stream 0")
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self._blocked.pop(stream_id, None)
                self._abandon(stream)
        elif kind == GOAWAY:
            self.going_away = True  # the peer opens no more streams; answer what it sent
        elif kind == PUSH_PROMISE:
            raise ProtocolFailure(PROTOCOL_ERROR, "clients cannot push")
        # PRIORITY and unknown frame types are ignored, as RFC 9113 asks.

    def _headers(self, flags: int, stream_id: int, payload: bytes, out: list) -> None:
        if stream_id == 0 or not stream_id & 1:
            raise ProtocolFailure(PROTOCOL_ERROR, "HEADERS on an invalid stream id")
        payload = _unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id <= self.last_stream_id:
                raise ProtocolFailure(STREAM_CLOSED, "HEADERS on a closed stream")
            self.last_stream_id = stream_id
            stream = Stream(stream_id, self._peer_initial_window)
            if len(self.streams) >= MAX_STREAMS or self.going_away_sent:
                stream.closed = True  # decoded below (HPACK state), then refused
            else:
                self.streams[stream_id] = stream
        if flags & END_HEADERS:
            self._headers_complete(stream, payload, flags, out)
        else:
            self._continuing, self._block, self._block_flags = stream, [payload], flags

    def _headers_complete(self, stream: Stream, block: bytes, flags: int, out: list) -> None:
        cached = self._decoded.get(block)
        if cached is not None and cached[0] == self._table_version:
            headers = cached[1]
        else:
            headers = self._decode(block)
        if stream.closed:
            out.append(frame(RST_STREAM, 0, stream.id, _U32.pack(REFUSED_STREAM)))
            return
        if stream.ended:
            raise ProtocolFailure(STREAM_CLOSED, "HEADERS after the stream ended")
        if stream.headers:  # trailers from the client: nothing in them matters here
            if not flags & END_STREAM:
                raise ProtocolFailure(PROTOCOL_ERROR, "trailers without END_STREAM")
        else:
            stream.headers = headers
        if flags & END_STREAM:
            stream.ended = True
            self.on_request(self, stream)

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """Decode with HPACK and remember the result for as long as it stays valid.

        Clients repeat the same header block call after call; decoding one in pure Python
        costs tens of µs. A block means the same thing again as long as the dynamic table
        is unchanged, so results are kept per table version, which moves on whenever a
        decode changes the table.
        """
        entries = self._decoder.header_table.dynamic_entries
        before = tuple(entries)
        try:
            headers = self._decoder.decode(block, raw=True)
        except HPACKError as exc:
            raise ProtocolFailure(COMPRESSION_ERROR, f"bad header block: {exc}") from None
        if tuple(entries) != before:
            self._table_version += 1
            self._decoded.clear()
        elif len(self._decoded) >= 64:
            self._decoded.clear()
        self._decoded[block] = (self._table_version, headers)
        return headers

    def _data(self, flags: int, stream_id: int, payload: bytes, out: list) -> None:
        self._unacked += len(payload)
        stream = self.streams.get(stream_id)
        if stream is None or stream.ended:
            if stream_id == 0 or not stream_id & 1 or stream_id > self.last_stream_id:
                raise ProtocolFailure(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we reset or answered: its data only counts for the window
        flow = len(payload)
        payload = _unpad(flags, payload)
        stream.received += len(payload)
        if stream.received > self.max_body:
            self.streams.pop(stream_id, None)
            self._abandon(stream)
            out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(CANCEL)))
            return
        stream.body.append(payload)
        if flags & END_STREAM:
            stream.ended = True
            self.on_request(self, stream)
            return
        stream.unacked += flow
        if stream.unacked >= RECEIVE_WINDOW // 2:
            out.append(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.unacked)))
            stream.unacked = 0

    def _settings(self, flags: int, stream_id: int, payload: bytes, out: list) -> None:
        if stream_id:
            raise ProtocolFailure(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise ProtocolFailure(FRAME_SIZE_ERROR, "SETTINGS length")
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolFailure(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= 16_777_215:
                    raise ProtocolFailure(PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self._peer_max_frame = value
            # Responses never use the dynamic table, so HEADER_TABLE_SIZE needs nothing.
        out.append(frame(SETTINGS, ACK, 0))
        self._flush_blocked(out)

    def _window_update(self, stream_id: int, payload: bytes, out: list) -> None:
        if len(payload) != 4:
            raise ProtocolFailure(FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if increment == 0:
            # A stream error in RFC 9113; ending the connection is allowed (§5.4.1).
            raise ProtocolFailure(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        if stream_id == 0:
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ProtocolFailure(FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            stream.send_window += increment
            if stream.send_window > MAX_WINDOW:
                raise ProtocolFailure(FLOW_CONTROL_ERROR, "stream window overflow")
        self._flush_blocked(out)

    # -- responses -------------------------------------------------------------------------
    def respond(self, stream: Stream, headers: bytes, body: bytes, trailers: bytes) -> None:
        """Send a response: HEADERS, then ``body`` as DATA (as windows allow), then
        ``trailers`` with END_STREAM. Empty ``body`` and ``trailers``: headers end it."""
        if stream.closed or self.transport is None or self.transport.is_closing():
            return
        if not body and not trailers:
            self._finish(stream)
            self._write(self._header_frames(stream.id, END_STREAM, headers))
            return
        out = [self._header_frames(stream.id, 0, headers)]
        stream.pending = memoryview(body)
        stream.trailers = trailers
        self._send_pending(stream, out)
        self._write(b"".join(out))

    def _send_pending(self, stream: Stream, out: list) -> None:
        pending = stream.pending
        while pending:
            size = min(len(pending), self._send_window, stream.send_window, self._peer_max_frame)
            if size <= 0:
                stream.pending = pending
                self._blocked[stream.id] = stream
                return
            out.append(frame(DATA, 0, stream.id, pending[:size].tobytes()))
            pending = pending[size:]
            self._send_window -= size
            stream.send_window -= size
        stream.pending = None
        self._blocked.pop(stream.id, None)
        self._finish(stream)
        out.append(self._header_frames(stream.id, END_STREAM, stream.trailers))

    def _header_frames(self, stream_id: int, flags: int, block: bytes) -> bytes:
        """HEADERS, plus CONTINUATIONs if ``block`` is over the peer's max frame size."""
        limit = self._peer_max_frame
        if len(block) <= limit:
            return frame(HEADERS, flags | END_HEADERS, stream_id, block)
        pieces = [block[i : i + limit] for i in range(0, len(block), limit)]
        out = [frame(HEADERS, flags, stream_id, pieces[0])]
        out += [frame(CONTINUATION, 0, stream_id, piece) for piece in pieces[1:-1]]
        out.append(frame(CONTINUATION, END_HEADERS, stream_id, pieces[-1]))
        return b"".join(out)

    def _flush_blocked(self, out: list) -> None:
        for stream in list(self._blocked.values()):
            if self._send_window <= 0:
                return
            self._send_pending(stream, out)

    def _finish(self, stream: Stream) -> None:
        stream.closed = True
        self.streams.pop(stream.id, None)

    def _write(self, data: bytes) -> None:
        """Write, then close if we are going away and this ended the last stream."""
        transport = self.transport
        if transport is None:
            return
        transport.write(data)
        if self.going_away_sent and not self.streams:
            transport.close()

    def _abandon(self, stream: Stream) -> None:
        stream.closed = True
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()

    # -- ending ----------------------------------------------------------------------------
    def goaway(self) -> None:
        """Refuse new streams, finish the open ones, then close (graceful shutdown)."""
        if self.transport is None or self.transport.is_closing() or self.going_away_sent:
            return
        self.going_away_sent = True
        payload = _U32.pack(self.last_stream_id) + _U32.pack(NO_ERROR)
        self.transport.write(frame(GOAWAY, 0, 0, payload))
        if not self.streams:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, code: int, message: str, out: list) -> None:
        logger.debug("HTTP/2 connection error %#x: %s", code, message)
        if self.transport is None:
            return
        out.append(frame(GOAWAY, 0, 0, _U32.pack(self.last_stream_id) + _U32.pack(code)))
        self.transport.write(b"".join(out))
        self.transport.close()

    def _close_now(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _unpad(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolFailure(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]
