"""A lean HTTP/2 server connection (RFC 9113) for request/response exchanges such as gRPC's.

The connection lives here (``Stream``, ``Http2Connection``); the wire vocabulary it
speaks (frame types, flags, error codes, SETTINGS, windows and budgets, ``Limits``,
``ProtocolFailure``, framing, header validation and the HPACK encoding of responses)
lives in ``http2_wire.py``.

It owns the wire: the preface, framing, SETTINGS, PING, GOAWAY, RST_STREAM, flow control
in both directions, CONTINUATION, padding, and HPACK decoding (the ``hpack`` library).
A stream whose request has ended (headers, body, END_STREAM) is handed to
``on_request``; the caller answers with ``respond``. Responses are encoded without the
dynamic table (static-table indexes and literals), so header blocks can be precomputed.

It also owns the wire's defences, as nghttp2 and grpc C-core have them (README, "Limits
and security"): receive flow control enforced, with windows replenished only as bodies
are consumed and a per-connection budget of buffered body bytes; every frame-validity
rule of RFC 9113 answered with the right GOAWAY or RST_STREAM; per-second budgets for
SETTINGS, PING, PRIORITY, RST_STREAM (rapid reset), empty frames and CONTINUATION, past
which the connection ends with GOAWAY ENHANCE_YOUR_CALM; a bounded HPACK table and
decode cache; header block size and count limits; the concurrent-stream cap; and the
handshake, idle, header, body and write timeouts, all checked by one timer per
connection (never a timer per frame or per stream).

Why not grpcio or h2: on the 2-core benchmark machine a unary call costs about 400 µs of
CPU in grpc.aio (C-core hands each call between threads) and about the same in h2 (an
event object per frame); this module's framing costs under 100 µs (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import hpack
from hpack import HPACKError, OversizedHeaderListError

from inferpool.frontends.http2_wire import (
    ACK,
    CANCEL,
    COMPRESSION_ERROR,
    CONNECTION_WINDOW,
    CONTINUATION,
    CONTINUATION_LIMIT,
    DATA,
    DEFAULT_LIMITS,
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    EMPTY_BUDGET,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_HEAD,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    MAX_WINDOW,
    NO_ERROR,
    PING,
    PING_BUDGET,
    PREFACE,
    PRIORITY,
    PRIORITY_BUDGET,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RECEIVE_FRAME,
    REFUSED_STREAM,
    RESET_BUDGET,
    RST_STREAM,
    SETTING,
    SETTINGS,
    SETTINGS_BUDGET,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_HEADER_TABLE_SIZE,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    STREAM_CLOSED,
    STREAM_WINDOW,
    U32,
    WINDOW_UPDATE,
    Limits,
    ProtocolFailure,
    frame,
    unpad,
    validate_headers,
)

logger = logging.getLogger(__name__)
# hpack logs every header it decodes at DEBUG: noise, and a cost per call at any level.
logging.getLogger("hpack").setLevel(logging.WARNING)

# Bytes of a body after which ``on_body_head`` is asked (gRPC's 5-byte message prefix).
BODY_HEAD = 5

# A decoded header list past this many times max_header_bytes ends the connection (the
# HPACK decoder had to stop mid-block); past max_header_bytes only the stream is refused.
DECODED_HEADER_FACTOR = 4
# Decoded header blocks kept per connection for reuse, bounded in entries and bytes.
CACHE_ENTRIES = 64
CACHE_BYTES = 128 * 1024
CACHED_BLOCK_MAX = 4096


class Stream:
    """One request/response exchange on a connection."""

    __slots__ = (
        "body",
        "closed",
        "ended",
        "headers",
        "held",
        "id",
        "length",
        "pending",
        "received",
        "recv_window",
        "refused",
        "seen",
        "send_window",
        "stalled_since",
        "task",
        "trailers",
        "unacked",
    )  # fmt: skip

    def __init__(self, stream_id: int, send_window: int, now: float = 0.0) -> None:
        self.id = stream_id
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.received = 0  # body bytes so far
        self.held = 0  # of which counted in the connection's buffered bytes
        self.length: int | None = None  # content-length, when the request declared one
        self.unacked = 0  # flow-controlled bytes not yet returned with WINDOW_UPDATE
        self.recv_window = STREAM_WINDOW  # what the peer may still send on this stream
        self.ended = False  # the peer sent END_STREAM
        self.refused = 0  # an error code: decode the header block, then reset the stream
        self.send_window = send_window
        self.pending: memoryview | None = None  # response DATA waiting for window
        self.trailers = b""
        self.task: asyncio.Future | None = None  # whoever answers it; cancelled on reset
        self.closed = False
        self.seen = 0  # ``received`` at the timer's last look (body timeout)
        self.stalled_since = now


OnRequest = Callable[["Http2Connection", Stream], None]
# Answers a stream the layer will not serve (a limit), e.g. with a gRPC status.
OnReject = Callable[["Http2Connection", Stream, str], None]


class Http2Connection(asyncio.Protocol):
    """The server side of one HTTP/2 connection."""

    def __init__(
        self,
        on_request: OnRequest,
        on_close: Callable[[Http2Connection], None] | None = None,
        max_body: int | None = None,
        *,
        limits: Limits = DEFAULT_LIMITS,
        registry: Any = None,
        on_reject: OnReject | None = None,
        on_body_head: Callable[[bytes], str | None] | None = None,
    ) -> None:
        self.on_request = on_request
        self.on_close = on_close
        self.limits = limits
        self.max_body = limits.max_body if max_body is None else max_body
        self.registry = registry  # frontends.connections.Connections, or None
        self.on_reject = on_reject
        self.on_body_head = on_body_head
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0
        self.going_away = False  # the peer sent GOAWAY
        self.going_away_sent = False  # we did: no new streams, close when the last ends
        self._partial: list[bytes] = []  # the start of a frame still arriving
        self._partial_bytes = 0
        self._needed = 0
        self._preface_seen = False
        self._settings_seen = False  # the peer's first SETTINGS (the end of the handshake)
        decoded_limit = max(limits.max_header_bytes * DECODED_HEADER_FACTOR, 4096)
        self._decoder = hpack.Decoder(max_header_list_size=decoded_limit)
        self._decoder.max_allowed_table_size = HEADER_TABLE_SIZE
        # Decoded header blocks, each with the dynamic-table version it was decoded under,
        # the verdict on it (None: serve it) and its content-length.
        self._decoded: dict[bytes, tuple[int, list, tuple[bool, str] | None, int | None]] = {}
        self._cache_bytes = 0
        self._table_version = 0
        self._continuing: Stream | None = None  # a header block waiting for CONTINUATION
        self._block: list[bytes] = []
        self._block_bytes = 0
        self._block_frames = 0
        self._block_flags = 0
        self._block_started = 0.0
        self._send_window = DEFAULT_WINDOW
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._recv_window = CONNECTION_WINDOW  # what the peer may still send in all
        self._buffered = 0  # body bytes of unfinished requests held on this connection
        self._body_budget = self.max_body + CONNECTION_WINDOW
        self._block_limit = 2 * limits.max_header_bytes  # encoded; past it the connection ends
        self._blocked: dict[int, Stream] = {}  # streams with DATA waiting for window
        # Budgets, refilled by the timer.
        self._pings = PING_BUDGET
        self._settings_left = SETTINGS_BUDGET
        self._priorities = PRIORITY_BUDGET
        self._resets = RESET_BUDGET
        self._empties = EMPTY_BUDGET
        # Timers: one callback per connection, re-armed every ``limits.tick`` seconds.
        self._now = time.monotonic()
        self._opened = self._budget_at = self._now
        self._idle_mark = self._now  # last time the timer saw a stream (or the start)
        self._active = False  # a stream was opened since the timer's last look
        self._paused_at: float | None = None
        self._closing_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._admitted = False
        self._closed_by_us = False  # close() called: read nothing more
        self.closed = asyncio.get_running_loop().create_future()

    # -- the connection registry (frontends.connections) -----------------------------------
    @property
    def idle_since(self) -> float | None:
        """Since when no stream has been open (coarse: the timer's clock); None while one is."""
        if self.streams or self._active or self._continuing is not None:
            return None
        return self._idle_mark

    def close_idle(self) -> None:
        """GOAWAY NO_ERROR and close: the connection is idle and its place is needed."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        payload = U32.pack(self.last_stream_id) + U32.pack(NO_ERROR)
        transport.write(frame(GOAWAY, 0, 0, payload))
        self.going_away_sent = self._closed_by_us = True
        transport.close()

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.registry is not None:
            if not self.registry.admit(self):
                transport.abort()  # type: ignore[attr-defined]
                return
            self._admitted = True
        limits = self.limits
        settings = b"".join(
            SETTING.pack(key, value)
            for key, value in (
                (SETTINGS_HEADER_TABLE_SIZE, HEADER_TABLE_SIZE),
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_streams),
                (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (SETTINGS_MAX_FRAME_SIZE, RECEIVE_FRAME),
                (SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_bytes),
            )
        )
        window = U32.pack(CONNECTION_WINDOW - DEFAULT_WINDOW)
        self.transport.write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, window))
        self._timer = asyncio.get_running_loop().call_later(limits.tick, self._tick)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for stream in self.streams.values():
            self._abandon(stream)
        self.streams.clear()
        self._blocked.clear()
        self._decoded.clear()
        self._cache_bytes = 0
        self._partial.clear()
        self._block = []
        self._continuing = None
        if self._admitted:
            self._admitted = False
            self.registry.release(self)
        if not self.closed.done():
            self.closed.set_result(None)
        if self.on_close is not None:
            self.on_close(self)

    def pause_writing(self) -> None:
        # The peer is not reading our replies: stop reading its requests until it does,
        # so a client that only sends cannot pile replies up in this process; the timer
        # closes the connection if it stays so for write_timeout.
        self._paused_at = time.monotonic()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused_at = None
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
                high, low, kind, flags, stream_id = FRAME_HEAD.unpack_from(data, pos)
                length = high << 8 | low
                if length > RECEIVE_FRAME:
                    raise ProtocolFailure(FRAME_SIZE_ERROR, "frame larger than advertised")
                if end - pos - 9 < length:
                    self._wait_for(data[pos:], 9 + length)
                    break
                payload = data[pos + 9 : pos + 9 + length]
                pos += 9 + length
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload, out)
                if self._closed_by_us:
                    return  # closed meanwhile (the last answer written after a GOAWAY)
        except ProtocolFailure as exc:
            self._fail(exc.code, str(exc), out)
            return
        if end - pos < 9 and pos < end:
            self._wait_for(data[pos:], 9)
        if CONNECTION_WINDOW - self._recv_window >= CONNECTION_WINDOW // 4:
            self._replenish(out)
        if out:
            self._write(b"".join(out))

    def _wait_for(self, head: bytes, needed: int) -> None:
        """Keep the start of an incomplete frame until ``needed`` bytes have arrived."""
        self._partial.append(head)
        self._partial_bytes = len(head)
        self._needed = needed

    def _replenish(self, out: list) -> None:
        """Give the peer back connection window, unless too much body is held already."""
        used = CONNECTION_WINDOW - self._recv_window
        if used >= CONNECTION_WINDOW // 4 and self._buffered < self._body_budget:
            out.append(frame(WINDOW_UPDATE, 0, 0, U32.pack(used)))
            self._recv_window = CONNECTION_WINDOW

    # -- frames in -------------------------------------------------------------------------
    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes, out: list) -> None:
        if self._continuing is not None and kind != CONTINUATION:
            raise ProtocolFailure(PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == DATA:
            self._data(flags, stream_id, payload, out)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload, out)
        elif not self._settings_seen and kind != SETTINGS:
            raise ProtocolFailure(PROTOCOL_ERROR, "the first frame must be SETTINGS")
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload, out)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload, out)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload, out)
        elif kind == PING:
            if stream_id:
                raise ProtocolFailure(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise ProtocolFailure(FRAME_SIZE_ERROR, "PING length")
            self._pings -= 1
            if self._pings < 0:
                raise ProtocolFailure(ENHANCE_YOUR_CALM, "PING flood")
            if not flags & ACK:
                out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == PRIORITY:
            self._priority(stream_id, payload, out)
        elif kind == GOAWAY:
            if stream_id:
                raise ProtocolFailure(PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise ProtocolFailure(FRAME_SIZE_ERROR, "GOAWAY length")
            self.going_away = True  # the peer opens no more streams; answer what it sent
        elif kind == PUSH_PROMISE:
            raise ProtocolFailure(PROTOCOL_ERROR, "clients cannot push")
        # Unknown frame types are ignored, as RFC 9113 asks.

    def _idle_stream(self, stream_id: int) -> bool:
        """A stream id the peer has not opened yet (or a server-side id: never opened)."""
        return stream_id > self.last_stream_id or not stream_id & 1

    def _headers(self, flags: int, stream_id: int, payload: bytes, out: list) -> None:
        if not self._settings_seen:
            raise ProtocolFailure(PROTOCOL_ERROR, "the first frame must be SETTINGS")
        if stream_id == 0 or not stream_id & 1:
            raise ProtocolFailure(PROTOCOL_ERROR, "HEADERS on an invalid stream id")
        payload = unpad(flags, payload)
        depends_on_itself = False
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise ProtocolFailure(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            depends_on_itself = U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id
            payload = payload[5:]
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id <= self.last_stream_id:
                raise ProtocolFailure(STREAM_CLOSED, "HEADERS on a closed stream")
            self.last_stream_id = stream_id
            stream = Stream(stream_id, self._peer_initial_window, self._now)
            self._active = True
            if depends_on_itself:
                stream.refused = PROTOCOL_ERROR
            elif len(self.streams) >= self.limits.max_streams or self.going_away_sent:
                stream.refused = REFUSED_STREAM  # decoded below (HPACK state), then refused
            else:
                self.streams[stream_id] = stream
        elif depends_on_itself:
            stream.refused = PROTOCOL_ERROR
        elif stream.ended:
            stream.refused = STREAM_CLOSED  # half-closed (remote): a stream error
        if flags & END_HEADERS:
            if not payload and not flags & END_STREAM:
                self._empty()
            self._headers_complete(stream, payload, flags, out)
        else:
            if not payload:
                self._empty()
            self._continuing, self._block, self._block_flags = stream, [payload], flags
            self._block_bytes, self._block_frames = len(payload), 0
            self._block_started = time.monotonic()
            self._check_block_size()

    def _continuation(self, flags: int, stream_id: int, payload: bytes, out: list) -> None:
        stream = self._continuing
        if stream is None or stream.id != stream_id:
            raise ProtocolFailure(PROTOCOL_ERROR, "unexpected CONTINUATION")
        self._block.append(payload)
        self._block_bytes += len(payload)  # a running total: O(1) per frame
        self._block_frames += 1
        if self._block_frames > CONTINUATION_LIMIT:
            raise ProtocolFailure(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        self._check_block_size()
        if flags & END_HEADERS:
            self._continuing = None
            block, self._block = b"".join(self._block), []
            self._headers_complete(stream, block, self._block_flags, out)
        elif not payload:
            self._empty()

    def _check_block_size(self) -> None:
        if self._block_bytes > self._block_limit:
            raise ProtocolFailure(
                ENHANCE_YOUR_CALM,
                f"header block over {self._block_limit} bytes "
                f"(max_header_bytes={self.limits.max_header_bytes})",
            )

    def _empty(self) -> None:
        self._empties -= 1
        if self._empties < 0:
            raise ProtocolFailure(ENHANCE_YOUR_CALM, "flood of empty frames")

    def _headers_complete(self, stream: Stream, block: bytes, flags: int, out: list) -> None:
        if len(block) > self._block_limit:
            raise ProtocolFailure(ENHANCE_YOUR_CALM, "header block over max_header_bytes")
        cached = self._decoded.get(block)
        if cached is not None and cached[0] == self._table_version:
            _, headers, verdict, length = cached
        else:
            headers, verdict, length = self._decode(block)
        if stream.refused:
            self._reset(stream, stream.refused, out)
            return
        if stream.headers:  # trailers from the client: nothing in them matters here
            if (
                not flags & END_STREAM  # trailers must end the stream
                or any(name[:1] == b":" for name, _ in headers)  # and carry no pseudo-header
                or (stream.length is not None and stream.received != stream.length)
            ):
                self._reset(stream, PROTOCOL_ERROR, out)
                return
        else:
            if verdict is not None:
                if verdict[0]:  # malformed (RFC 9113 §8.1.1): a stream error
                    self._reset(stream, PROTOCOL_ERROR, out)
                else:  # over a limit: answered, naming it
                    stream.headers = headers
                    stream.ended = bool(flags & END_STREAM)
                    self._reject(stream, verdict[1], out)
                return
            stream.headers = headers
            stream.length = length
            if flags & END_STREAM and length:
                self._reset(stream, PROTOCOL_ERROR, out)  # content-length but no DATA
                return
        if flags & END_STREAM:
            stream.ended = True
            self._hand_over(stream)

    def _decode(self, block: bytes) -> tuple[list, tuple[bool, str] | None, int | None]:
        """Decode with HPACK, judge, and remember the result while it stays valid.

        Clients repeat the same header block call after call; decoding and validating one
        in pure Python costs tens of µs. A block means the same thing again as long as the
        dynamic table is unchanged, so results are kept per table version, which moves on
        whenever a decode changes the table. The cache is bounded in entries and bytes.
        The verdict is None for a request to serve, else (malformed, message).
        """
        entries = self._decoder.header_table.dynamic_entries
        before = tuple(entries)
        try:
            headers = self._decoder.decode(block, raw=True)
        except OversizedHeaderListError:
            raise ProtocolFailure(ENHANCE_YOUR_CALM, "decoded header list too large") from None
        except HPACKError as exc:
            raise ProtocolFailure(COMPRESSION_ERROR, f"bad header block: {exc}") from None
        problem, size, length = validate_headers(headers)
        limits = self.limits
        verdict: tuple[bool, str] | None = None
        if problem is not None:
            verdict = (True, problem)
        elif size > limits.max_header_bytes:
            verdict = (
                False,
                f"request headers of {size} bytes are over the limit of "
                f"{limits.max_header_bytes} bytes (max_header_bytes)",
            )
        elif len(headers) > limits.max_header_count:
            verdict = (
                False,
                f"{len(headers)} request headers are over the limit of "
                f"{limits.max_header_count} (max_header_count)",
            )
        if tuple(entries) != before:
            self._table_version += 1
            self._decoded.clear()
            self._cache_bytes = 0
        if len(block) <= CACHED_BLOCK_MAX and size <= CACHED_BLOCK_MAX:
            cost = len(block) + size
            if len(self._decoded) >= CACHE_ENTRIES or self._cache_bytes + cost > CACHE_BYTES:
                self._decoded.clear()
                self._cache_bytes = 0
            self._decoded[block] = (self._table_version, headers, verdict, length)
            self._cache_bytes += cost
        return headers, verdict, length

    def _data(self, flags: int, stream_id: int, payload: bytes, out: list) -> None:
        if not self._settings_seen:
            raise ProtocolFailure(PROTOCOL_ERROR, "the first frame must be SETTINGS")
        if stream_id == 0 or stream_id > self.last_stream_id or not stream_id & 1:
            raise ProtocolFailure(PROTOCOL_ERROR, "DATA on an idle stream")
        flow = len(payload)
        if flow > self._recv_window:
            raise ProtocolFailure(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_window -= flow
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream we reset or answered: its data only counts for the window
        if stream.ended:
            self._reset(stream, STREAM_CLOSED, out)  # half-closed (remote)
            return
        if flow > stream.recv_window:
            self._reset(stream, FLOW_CONTROL_ERROR, out)
            return
        stream.recv_window -= flow
        payload = unpad(flags, payload)
        size = len(payload)
        if not size and not flags & END_STREAM:
            self._empty()
        before = stream.received
        stream.received = received = before + size
        if stream.length is not None and (
            received > stream.length or (flags & END_STREAM and received != stream.length)
        ):
            self._reset(stream, PROTOCOL_ERROR, out)  # content-length does not match
            return
        if received > self.max_body:
            self._reject(
                stream,
                f"request body over the limit of {self.max_body} bytes (max_body_bytes)",
                out,
            )
            return
        if size:
            stream.body.append(payload)
            stream.held += size
            self._buffered += size
        if before < BODY_HEAD <= received and self.on_body_head is not None:
            first = stream.body[0]
            head = first[:BODY_HEAD] if len(first) >= BODY_HEAD else b"".join(stream.body)
            head = head[:BODY_HEAD]
            problem = self.on_body_head(head)
            if problem is not None:
                self._reject(stream, problem, out)
                return
        if flags & END_STREAM:
            stream.ended = True
            self._hand_over(stream)
            return
        stream.unacked += flow
        if stream.unacked >= STREAM_WINDOW // 4 and received < self.max_body:
            out.append(frame(WINDOW_UPDATE, 0, stream_id, U32.pack(stream.unacked)))
            stream.recv_window += stream.unacked
            stream.unacked = 0

    def _hand_over(self, stream: Stream) -> None:
        """The request is whole: its body is now the call's (consumed), not the wire's."""
        self._buffered -= stream.held
        stream.held = 0
        self.on_request(self, stream)

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolFailure(FRAME_SIZE_ERROR, "RST_STREAM length")
        if stream_id == 0:
            raise ProtocolFailure(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if self._idle_stream(stream_id):
            raise ProtocolFailure(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        self._resets -= 1
        if self._resets < 0:
            raise ProtocolFailure(ENHANCE_YOUR_CALM, "RST_STREAM flood (rapid reset)")
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            self._drop(stream)

    def _priority(self, stream_id: int, payload: bytes, out: list) -> None:
        if stream_id == 0:
            raise ProtocolFailure(PROTOCOL_ERROR, "PRIORITY on stream 0")
        self._priorities -= 1
        if self._priorities < 0:
            raise ProtocolFailure(ENHANCE_YOUR_CALM, "PRIORITY flood")
        if len(payload) != 5:
            self._reset_id(stream_id, FRAME_SIZE_ERROR, out)
        elif U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
            self._reset_id(stream_id, PROTOCOL_ERROR, out)  # a stream depending on itself

    def _settings(self, flags: int, stream_id: int, payload: bytes, out: list) -> None:
        if stream_id:
            raise ProtocolFailure(PROTOCOL_ERROR, "SETTINGS on a stream")
        self._settings_left -= 1
        if self._settings_left < 0:
            raise ProtocolFailure(ENHANCE_YOUR_CALM, "SETTINGS flood")
        if flags & ACK:
            if payload:
                raise ProtocolFailure(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            if not self._settings_seen:
                raise ProtocolFailure(PROTOCOL_ERROR, "the first frame must be SETTINGS")
            return
        if len(payload) % 6:
            raise ProtocolFailure(FRAME_SIZE_ERROR, "SETTINGS length")
        self._settings_seen = True
        for offset in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolFailure(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ProtocolFailure(FLOW_CONTROL_ERROR, "stream window overflow")
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= 16_777_215:
                    raise ProtocolFailure(PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self._peer_max_frame = value
            elif key == SETTINGS_ENABLE_PUSH and value > 1:
                raise ProtocolFailure(PROTOCOL_ERROR, "bad SETTINGS_ENABLE_PUSH")
            # Responses never use the dynamic table, so HEADER_TABLE_SIZE needs nothing.
        out.append(frame(SETTINGS, ACK, 0))
        self._flush_blocked(out)

    def _window_update(self, stream_id: int, payload: bytes, out: list) -> None:
        if len(payload) != 4:
            raise ProtocolFailure(FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ProtocolFailure(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ProtocolFailure(FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            if self._idle_stream(stream_id):
                raise ProtocolFailure(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            if increment == 0:
                self._reset(stream, PROTOCOL_ERROR, out)  # a stream error (§6.9)
                return
            stream.send_window += increment
            if stream.send_window > MAX_WINDOW:
                self._reset(stream, FLOW_CONTROL_ERROR, out)
                return
        self._flush_blocked(out)

    # -- stream errors ---------------------------------------------------------------------
    def _reset(self, stream: Stream, code: int, out: list) -> None:
        """A stream error: RST_STREAM(code), the stream and its data dropped."""
        self._count_reset()
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
        self._blocked.pop(stream.id, None)
        self._drop(stream)
        out.append(frame(RST_STREAM, 0, stream.id, U32.pack(code)))

    def _reset_id(self, stream_id: int, code: int, out: list) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._reset(stream, code, out)
        else:
            self._count_reset()
            out.append(frame(RST_STREAM, 0, stream_id, U32.pack(code)))

    def _count_reset(self) -> None:
        self._resets -= 1
        if self._resets < 0:
            raise ProtocolFailure(ENHANCE_YOUR_CALM, "too many stream errors")

    def _reject(self, stream: Stream, message: str, out: list) -> None:
        """A request over a limit: answered (``on_reject``) at once, its data dropped; if
        the peer is still sending, RST_STREAM NO_ERROR stops it (RFC 9113 §8.1)."""
        self._drop(stream)
        stream.closed = False  # still to be answered
        if self.on_reject is not None:
            self.on_reject(self, stream, message)
            if not stream.ended:
                out.append(frame(RST_STREAM, 0, stream.id, U32.pack(NO_ERROR)))
        else:
            out.append(frame(RST_STREAM, 0, stream.id, U32.pack(REFUSED_STREAM)))
        self._finish(stream)
        self._blocked.pop(stream.id, None)

    def _drop(self, stream: Stream) -> None:
        """Forget a stream's body (it counts no more against the connection) and cancel
        whoever is answering it."""
        self._buffered -= stream.held
        stream.held = 0
        stream.body = []
        self._abandon(stream)

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
        if stream.held:
            self._buffered -= stream.held
            stream.held = 0

    def _write(self, data: bytes) -> None:
        """Write, then close if we are going away and this ended the last stream."""
        transport = self.transport
        if transport is None:
            return
        transport.write(data)
        if self.going_away_sent and not self.streams:
            self._closed_by_us = True
            transport.close()

    def _abandon(self, stream: Stream) -> None:
        stream.closed = True
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()

    # -- the timer -------------------------------------------------------------------------
    def _tick(self) -> None:
        """Once per ``limits.tick``: refill the budgets and enforce every timeout."""
        self._timer = None
        transport = self.transport
        if transport is None:
            return
        limits = self.limits
        now = self._now = time.monotonic()
        loop = asyncio.get_running_loop()
        if transport.is_closing():
            # Closing waits for the buffer to drain; a peer that never reads is cut off.
            if self._closing_since is None:
                self._closing_since = now
            elif now - self._closing_since > max(limits.write_timeout, 1.0):
                transport.abort()
                return
            self._timer = loop.call_later(limits.tick, self._tick)
            return
        if now - self._budget_at >= 1.0:  # budgets are per second, whatever the tick
            self._budget_at = now
            self._pings, self._settings_left = PING_BUDGET, SETTINGS_BUDGET
            self._priorities, self._resets = PRIORITY_BUDGET, RESET_BUDGET
            self._empties = EMPTY_BUDGET
        out: list[bytes] = []
        if not self._settings_seen:
            if 0 < limits.handshake_timeout < now - self._opened:
                logger.debug("HTTP/2 handshake not finished in %.1fs", limits.handshake_timeout)
                transport.close()
                return
        elif self._paused_at is not None and 0 < limits.write_timeout < now - self._paused_at:
            logger.debug("HTTP/2 peer left its answers unread for %.1fs", limits.write_timeout)
            transport.abort()
            return
        elif self._continuing is not None and 0 < limits.header_timeout < now - self._block_started:
            self._fail(ENHANCE_YOUR_CALM, "header block not finished in time", out)
            return
        elif self.streams or self._active:
            self._idle_mark = now
            self._active = False
            self._check_streams(now, out)
        elif 0 < limits.idle_timeout < now - self._idle_mark:
            self.close_idle()
            return
        self._replenish(out)
        if out:
            self._write(b"".join(out))
        self._timer = loop.call_later(limits.tick, self._tick)

    def _check_streams(self, now: float, out: list) -> None:
        """Reset a stream whose body stopped arriving for body_timeout, or whose answer
        waits for flow-control window the peer has not given for write_timeout."""
        body_timeout, write_timeout = self.limits.body_timeout, self.limits.write_timeout
        for stream in list(self.streams.values()):
            if not stream.ended:
                progress, timeout = stream.received, body_timeout
            elif stream.pending is not None:
                progress, timeout = -len(stream.pending), write_timeout
            else:
                continue  # the call is running
            if progress != stream.seen:
                stream.seen, stream.stalled_since = progress, now
            elif 0 < timeout < now - stream.stalled_since:
                logger.debug("HTTP/2 stream %d stalled for %.1fs", stream.id, timeout)
                self._resets += 1  # ours, not the peer's doing: no budget spent
                self._reset(stream, CANCEL, out)

    # -- ending ----------------------------------------------------------------------------
    def goaway(self) -> None:
        """Refuse new streams, finish the open ones, then close (graceful shutdown)."""
        if self.transport is None or self.transport.is_closing() or self.going_away_sent:
            return
        self.going_away_sent = True
        payload = U32.pack(self.last_stream_id) + U32.pack(NO_ERROR)
        self.transport.write(frame(GOAWAY, 0, 0, payload))
        if not self.streams:
            self._closed_by_us = True
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, code: int, message: str, out: list) -> None:
        logger.debug("HTTP/2 connection error %#x: %s", code, message)
        if self.transport is None or self.transport.is_closing():
            return
        self.going_away_sent = True
        payload = U32.pack(self.last_stream_id) + U32.pack(code) + message.encode()[:256]
        out.append(frame(GOAWAY, 0, 0, payload))
        self.transport.write(b"".join(out))
        self._closed_by_us = True
        self.transport.close()
        for stream in self.streams.values():
            self._abandon(stream)
        self.streams.clear()
        self._blocked.clear()
        self._buffered = 0

    def _close_now(self) -> None:
        if self.transport is not None:
            self.transport.close()
