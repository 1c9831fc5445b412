"""Frames in: what each frame the peer sends does to the connection (RFC 9113 §4-§6).

``Http2FrameReader`` applies one frame at a time (``_frame``), answering into ``out``:
opening streams from HEADERS and CONTINUATION (decoded by ``http2_headers``), collecting
DATA under receive flow control (windows given back only as bodies are consumed, and a
per-connection budget of buffered body bytes), SETTINGS, WINDOW_UPDATE, PING, PRIORITY,
RST_STREAM and GOAWAY. Every frame-validity rule is answered with the right stream error
(RST_STREAM, through ``http2_streams``) or connection error (``ProtocolFailure``, which
ends the connection with GOAWAY); SETTINGS, PING, PRIORITY, RST_STREAM, empty frames and
CONTINUATION spend per-second budgets, past which the code is ENHANCE_YOUR_CALM. A stream
whose request has ended is handed to ``on_request``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from inferpool.transport.http2_headers import HeaderDecoder
from inferpool.transport.http2_streams import REFUSED, Http2Streams, OnReject, Stream
from inferpool.transport.http2_wire import (
    ACK,
    CONNECTION_WINDOW,
    CONTINUATION,
    CONTINUATION_LIMIT,
    DATA,
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    EMPTY_BUDGET,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    NO_ERROR,
    PING,
    PING_BUDGET,
    PRIORITY,
    PRIORITY_BUDGET,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTING,
    SETTINGS,
    SETTINGS_BUDGET,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    STREAM_CLOSED,
    STREAM_WINDOW,
    U32,
    WINDOW_UPDATE,
    Limits,
    ProtocolFailure,
    frame,
    unpad,
)
from inferpool.transport.unsent import ANSWERS, PER_CONNECTION

if TYPE_CHECKING:
    from inferpool.transport.http2 import Http2Connection

# Bytes of a body after which ``on_body_head`` is asked (gRPC's 5-byte message prefix).
BODY_HEAD = 5

OnRequest = Callable[["Http2Connection", Stream], None]
# A held stream's first DATA payload -> a whole header block to answer it with now (its
# body then dropped unread), or None to read it whole as usual.
OnBodyStart = Callable[[Stream, bytes], bytes | None]


class Http2FrameReader(Http2Streams):
    """The frame rules of a server connection; ``Http2Connection`` feeds it frames."""

    def __init__(
        self,
        on_request: OnRequest,
        max_body: int | None,
        limits: Limits,
        on_reject: OnReject | None,
        on_body_head: Callable[[bytes], str | None] | None,
    ) -> None:
        super().__init__(on_reject)
        self.on_request = on_request
        # Called with a request's headers before its body (``Http2Connection``'s
        # ``on_headers``): it may answer at once, or take the body as it comes
        # (``Stream.on_data``) instead of whole at its end (``on_request``).
        self.on_headers: OnRequest | None = None
        self.on_body_head = on_body_head
        # Asked once with the first DATA payload of a body read whole (``OnBodyStart``).
        self.on_body_start: OnBodyStart | None = None
        self.limits = limits
        self.max_body = limits.max_body if max_body is None else max_body
        self.last_stream_id = 0
        self.going_away = False  # the peer sent GOAWAY
        self._settings_seen = False  # the peer's first SETTINGS (the end of the handshake)
        self._header_decoder = HeaderDecoder(limits)
        self._continuing: Stream | None = None  # a header block waiting for CONTINUATION
        self._block: list[bytes] = []
        self._block_bytes = 0
        self._block_frames = 0
        self._block_flags = 0
        self._block_started = 0.0
        self._block_limit = 2 * limits.max_header_bytes  # encoded; past it the connection ends
        self._peer_initial_window = DEFAULT_WINDOW
        self._recv_window = CONNECTION_WINDOW  # what the peer may still send in all
        self._body_budget = self.max_body + CONNECTION_WINDOW
        # Budgets, refilled by the connection's timer.
        self._pings = PING_BUDGET
        self._settings_left = SETTINGS_BUDGET
        self._priorities = PRIORITY_BUDGET
        self._empties = EMPTY_BUDGET
        self._now = time.monotonic()  # the timer's clock: new streams start stalled now
        self._active = False  # a stream was opened since the timer's last look

    def _replenish(self, out: list[bytes]) -> None:
        """Give the peer back connection window, unless too much body is held already."""
        used = CONNECTION_WINDOW - self._recv_window
        if used >= CONNECTION_WINDOW // 4 and self._buffered < self._body_budget:
            out.append(frame(WINDOW_UPDATE, 0, 0, U32.pack(used)))
            self._recv_window = CONNECTION_WINDOW

    # -- frames in -------------------------------------------------------------------------
    def _frame(
        self, kind: int, flags: int, stream_id: int, payload: bytes, out: list[bytes]
    ) -> None:
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

    def _headers(self, flags: int, stream_id: int, payload: bytes, out: list[bytes]) -> None:
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
            elif self.going_away_sent:
                stream.refused = REFUSED_STREAM  # decoded below (HPACK state), then refused
            elif len(self.streams) >= self.limits.max_streams:
                stream.refused = REFUSED_STREAM
                REFUSED["max_concurrent_streams"] += 1
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

    def _continuation(self, flags: int, stream_id: int, payload: bytes, out: list[bytes]) -> None:
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

    def _headers_complete(self, stream: Stream, block: bytes, flags: int, out: list[bytes]) -> None:
        if len(block) > self._block_limit:
            raise ProtocolFailure(ENHANCE_YOUR_CALM, "header block over max_header_bytes")
        headers, verdict, length = self._header_decoder.decode(block)
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
                limit, message = verdict
                if limit is None:  # malformed (RFC 9113 §8.1.1): a stream error
                    self._reset(stream, PROTOCOL_ERROR, out)
                else:  # over a limit: answered, naming it
                    stream.headers = headers
                    stream.ended = bool(flags & END_STREAM)
                    self._reject(stream, limit, message, out)
                return
            stream.headers = headers
            stream.length = length
            if self._blocked and self._holds_too_much(stream, flags, out):
                return
            if flags & END_STREAM and length:
                self._reset(stream, PROTOCOL_ERROR, out)  # content-length but no DATA
                return
            if self.on_headers is not None:
                self.on_headers(self, stream)  # type: ignore[arg-type]
                if stream.closed:  # answered at once: the rest of the request is not read
                    if not flags & END_STREAM:
                        out.append(frame(RST_STREAM, 0, stream.id, U32.pack(NO_ERROR)))
                    return
        if flags & END_STREAM:
            stream.ended = True
            if stream.on_data is not None:
                stream.on_data(b"", True)
            else:
                self._hand_over(stream)

    def _holds_too_much(self, stream: Stream, flags: int, out: list[bytes]) -> bool:
        """Refuse a new stream (answered RESOURCE_EXHAUSTED by ``on_reject``) while the
        connection holds more unread answers than its bound: its peer does not read them."""
        refusal = ANSWERS.connection_refusal(self)
        if refusal is None:
            return False
        stream.ended = bool(flags & END_STREAM)
        self._reject(stream, PER_CONNECTION, refusal, out)
        return True

    def _data(self, flags: int, stream_id: int, payload: bytes, out: list[bytes]) -> None:
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
        if stream.on_data is not None:  # read as it comes: the call bounds its messages
            self._stream_data(stream, flags, flow, payload, out)
        else:  # a unary call: its body is held until it ends
            self._hold_data(stream, flags, flow, payload, before, out)

    def _hold_data(
        self, stream: Stream, flags: int, flow: int, payload: bytes, before: int, out: list[bytes]
    ) -> None:
        """Keep a DATA frame's payload for a body read whole, within ``max_body``; its
        first ``BODY_HEAD`` bytes are shown to ``on_body_head`` (a declared length)."""
        received, size = stream.received, len(payload)
        if received > self.max_body:
            self._reject(
                stream,
                "max_body_bytes",
                f"request body over the limit of {self.max_body} bytes (max_body_bytes)",
                out,
            )
            return
        if not before and size and self.on_body_start is not None:
            answer = self.on_body_start(stream, payload)
            if answer is not None:
                self._answer_now(stream, answer, out)
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
            if problem is not None:  # the message's declared length: a body limit
                self._reject(stream, "max_body_bytes", problem, out)
                return
        if flags & END_STREAM:
            stream.ended = True
            self._hand_over(stream)
            return
        stream.unacked += flow
        if stream.unacked >= STREAM_WINDOW // 4 and received < self.max_body:
            out.append(frame(WINDOW_UPDATE, 0, stream.id, U32.pack(stream.unacked)))
            stream.recv_window += stream.unacked
            stream.unacked = 0

    def _stream_data(
        self, stream: Stream, flags: int, flow: int, payload: bytes, out: list[bytes]
    ) -> None:
        """DATA of a stream whose call reads its body as it comes (``Stream.on_data``)."""
        assert stream.on_data is not None
        ended = bool(flags & END_STREAM)
        stream.ended = ended
        stream.on_data(payload, ended)
        if ended:
            return
        stream.unacked += flow
        if stream.unacked >= STREAM_WINDOW // 4:
            out.append(frame(WINDOW_UPDATE, 0, stream.id, U32.pack(stream.unacked)))
            stream.recv_window += stream.unacked
            stream.unacked = 0

    def _hand_over(self, stream: Stream) -> None:
        """The request is whole: its body is now the call's (consumed), not the wire's."""
        self._buffered -= stream.held
        stream.held = 0
        # ``self`` is always an Http2Connection, the one subclass of this base.
        self.on_request(self, stream)  # type: ignore[arg-type]

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

    def _priority(self, stream_id: int, payload: bytes, out: list[bytes]) -> None:
        if stream_id == 0:
            raise ProtocolFailure(PROTOCOL_ERROR, "PRIORITY on stream 0")
        self._priorities -= 1
        if self._priorities < 0:
            raise ProtocolFailure(ENHANCE_YOUR_CALM, "PRIORITY flood")
        if len(payload) != 5:
            self._reset_id(stream_id, FRAME_SIZE_ERROR, out)
        elif U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
            self._reset_id(stream_id, PROTOCOL_ERROR, out)  # a stream depending on itself

    def _settings(self, flags: int, stream_id: int, payload: bytes, out: list[bytes]) -> None:
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

    def _window_update(self, stream_id: int, payload: bytes, out: list[bytes]) -> None:
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
