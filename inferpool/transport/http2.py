"""A lean HTTP/2 server connection (RFC 9113) for request/response exchanges such as gRPC's.

``Http2Connection`` is the asyncio protocol: the preface, cutting bytes into frames,
the timer, the connection registry, and ending (GOAWAY). It is built in layers, one
concept per module: ``http2_frames.py`` (what each frame received does, on top of)
``http2_streams.py`` (the streams, responses under flow control, stream errors), with
``http2_headers.py`` (HPACK decoding and its cache) and ``http2_wire.py`` (the wire
vocabulary: frame types, flags, error codes, SETTINGS, windows and budgets, ``Limits``,
``ProtocolFailure``, framing, header validation, the HPACK encoding of responses). It
knows nothing of what the requests mean: ``frontends/grpc/h2.py`` routes them.

It owns the wire: the preface, framing, SETTINGS, PING, GOAWAY, RST_STREAM, flow control
in both directions, CONTINUATION, padding, and HPACK decoding (the ``hpack`` library).
A stream whose request has ended (headers, body, END_STREAM) is handed to
``on_request``; the caller answers with ``respond``. Responses are encoded without the
dynamic table (static-table indexes and literals), so header blocks can be precomputed.

It also owns the wire's defences, as nghttp2 and grpc C-core have them
(docs/operate/limits.md): receive flow control enforced, with windows replenished only as bodies
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
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

from inferpool.transport.http2_frames import Http2FrameReader, OnRequest
from inferpool.transport.http2_streams import OnReject
from inferpool.transport.http2_wire import (
    CANCEL,
    CONNECTION_WINDOW,
    DEFAULT_LIMITS,
    DEFAULT_WINDOW,
    EMPTY_BUDGET,
    ENHANCE_YOUR_CALM,
    FRAME_HEAD,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
    NO_ERROR,
    PING_BUDGET,
    PREFACE,
    PRIORITY_BUDGET,
    RECEIVE_FRAME,
    RESET_BUDGET,
    SETTING,
    SETTINGS,
    SETTINGS_BUDGET,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_HEADER_TABLE_SIZE,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    STREAM_WINDOW,
    U32,
    WINDOW_UPDATE,
    Limits,
    ProtocolFailure,
    frame,
)
from inferpool.transport.unsent import ANSWERS

logger = logging.getLogger(__name__)
# hpack logs every header it decodes at DEBUG: noise, and a cost per call at any level.
logging.getLogger("hpack").setLevel(logging.WARNING)

# GOAWAY frames sent by every connection of this process, by error code (the metrics).
GOAWAYS_SENT: Counter[int] = Counter()


class Http2Connection(Http2FrameReader):
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
        on_headers: OnRequest | None = None,
    ) -> None:
        super().__init__(on_request, max_body, limits, on_reject, on_body_head)
        self.on_headers = on_headers
        self.on_close = on_close
        self.registry = registry  # admits and releases connections (admit, release), or None
        self._partial: list[bytes] = []  # the start of a frame still arriving
        self._partial_bytes = 0
        self._needed = 0
        self._preface_seen = False
        # Timers: one callback per connection, re-armed every ``limits.tick`` seconds.
        self._opened = self._budget_at = self._now
        self._idle_mark = self._now  # last time the timer saw a stream (or the start)
        self._paused_at: float | None = None
        self._closing_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._admitted = False
        self.closed = asyncio.get_running_loop().create_future()

    # -- the connection registry (frontends.connections) -----------------------------------
    # The frontend named when the registry refuses it: gRPC is this layer's one user.
    frontend = "grpc"

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
        GOAWAYS_SENT[NO_ERROR] += 1
        self.going_away_sent = self._closed_by_us = True
        transport.close()

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's transport: asyncio's or uvloop's TCP transport.
        self.transport = tcp = cast(asyncio.Transport, transport)
        if self.registry is not None:
            if not self.registry.admit(self):
                tcp.abort()
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
        tcp.write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, window))
        self._timer = asyncio.get_running_loop().call_later(limits.tick, self._tick)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for stream in self.streams.values():
            self._abandon(stream)
        self.streams.clear()
        self._blocked.clear()
        self._header_decoder.clear()
        self._partial.clear()
        self._block = []
        self._continuing = None
        ANSWERS.release(self)
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
        ANSWERS.hold(self)
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
            self._write_out(out)

    def _wait_for(self, head: bytes, needed: int) -> None:
        """Keep the start of an incomplete frame until ``needed`` bytes have arrived."""
        self._partial.append(head)
        self._partial_bytes = len(head)
        self._needed = needed

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
            self._write_out(out)
        self._timer = loop.call_later(limits.tick, self._tick)

    def _check_streams(self, now: float, out: list[bytes]) -> None:
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
        GOAWAYS_SENT[NO_ERROR] += 1
        if not self.streams:
            self._closed_by_us = True
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, code: int, message: str, out: list[bytes]) -> None:
        logger.debug("HTTP/2 connection error %#x: %s", code, message)
        if self.transport is None or self.transport.is_closing():
            return
        self.going_away_sent = True
        payload = U32.pack(self.last_stream_id) + U32.pack(code) + message.encode()[:256]
        out.append(frame(GOAWAY, 0, 0, payload))
        GOAWAYS_SENT[code] += 1
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
