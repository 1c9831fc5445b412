"""A connection's streams and what goes out on them: answers under flow control, and
stream errors (RFC 9113 §5.4.2).

``Stream`` is one request/response exchange. ``Http2Streams`` is the base of the
connection (``http2.py``): the open streams, the send windows, and ``respond``, which
writes HEADERS, DATA as the peer's windows allow, then the trailers (or, for a response
sent in pieces such as a gRPC server stream: ``open_stream``, ``send_data``,
``end_stream``). Responses are encoded without the dynamic table (static-table indexes and
literals), so header blocks can be precomputed. Frames read (``http2_frames.py``) reset,
reject or answer streams through the methods here.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from inferpool.transport.http2_wire import (
    CONTINUATION,
    DATA,
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    HEADERS,
    NO_ERROR,
    REFUSED_STREAM,
    RESET_BUDGET,
    RST_STREAM,
    STREAM_WINDOW,
    U32,
    ProtocolFailure,
    frame,
    frame_head,
)
from inferpool.transport.unsent import ANSWERS

if TYPE_CHECKING:
    from inferpool.transport.http2 import Http2Connection

# A DATA frame of this many bytes or more goes out as its head and a view of the answer,
# written with the transport's ``writelines`` (``_write_out``): a large answer is not copied
# frame by frame, then joined, before the kernel copies it. Smaller frames are joined: one
# write of one bytes object is cheaper than a list of pieces.
VIEW_FRAME = 64 * 1024


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
        "on_data",
        "pending",
        "received",
        "recv_window",
        "refused",
        "rest",
        "seen",
        "send_window",
        "stalled_since",
        "streaming",
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
        self.rest: memoryview | None = None  # DATA to send once ``pending`` is (``respond``'s lead)
        self.trailers = b""
        self.streaming = False  # a response of several messages (open_stream) not yet ended
        self.task: asyncio.Future[None] | None = None  # whoever answers it; cancelled on reset
        # Set by ``on_headers`` for a call that reads its body as it comes (a client-streaming
        # gRPC call): each DATA payload goes there, with True once the peer ended the stream.
        self.on_data: Callable[[bytes, bool], None] | None = None
        self.closed = False
        self.seen = 0  # ``received`` at the timer's last look (body timeout)
        self.stalled_since = now


# Answers a stream the layer will not serve (a limit), e.g. with a gRPC status.
OnReject = Callable[["Http2Connection", Stream, str], None]

# Streams of this process refused by a limit, by the limit's setting name (the metrics).
REFUSED: Counter[str] = Counter()


class Http2Streams(asyncio.Protocol):
    """The open streams of a connection and the sending side; ``Http2Connection``'s base."""

    def __init__(self, on_reject: OnReject | None) -> None:
        self.on_reject = on_reject
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.going_away_sent = False  # we sent GOAWAY: no new streams, close after the last
        self._closed_by_us = False  # close() called: read nothing more
        self._send_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._blocked: dict[int, Stream] = {}  # streams with DATA waiting for window
        self._buffered = 0  # body bytes of unfinished requests held on this connection
        self._biggest = 0  # the largest write since the transport's buffer was last empty
        self._views = False  # the frames being gathered hold views of an answer (VIEW_FRAME)
        # RST_STREAM received plus streams we reset: a per-second budget the timer refills.
        self._resets = RESET_BUDGET

    # -- stream errors ---------------------------------------------------------------------
    def _reset(self, stream: Stream, code: int, out: list[bytes]) -> None:
        """A stream error: RST_STREAM(code), the stream and its data dropped."""
        self._count_reset()
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
        if self._blocked.pop(stream.id, None) is not None:
            ANSWERS.released()  # an answer that waited for window is dropped
        self._drop(stream)
        out.append(frame(RST_STREAM, 0, stream.id, U32.pack(code)))

    def _reset_id(self, stream_id: int, code: int, out: list[bytes]) -> None:
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

    def _reject(self, stream: Stream, limit: str, message: str, out: list[bytes]) -> None:
        """A request over a limit (``limit``, its setting name): answered (``on_reject``) at
        once, its data dropped; if the peer is still sending, RST_STREAM NO_ERROR stops it
        (RFC 9113 §8.1)."""
        REFUSED[limit] += 1
        self._drop(stream)
        stream.closed = False  # still to be answered
        if self.on_reject is not None:
            # ``self`` is always an Http2Connection, the one subclass of this base.
            self.on_reject(self, stream, message)  # type: ignore[arg-type]
            if not stream.ended:
                out.append(frame(RST_STREAM, 0, stream.id, U32.pack(NO_ERROR)))
        else:
            out.append(frame(RST_STREAM, 0, stream.id, U32.pack(REFUSED_STREAM)))
        self._finish(stream)
        self._blocked.pop(stream.id, None)

    def _answer_now(self, stream: Stream, headers: bytes, out: list[bytes]) -> None:
        """Answer a request with ``headers`` alone (a gRPC trailers-only refusal) before
        its body is read; the rest of its body is dropped (RST_STREAM NO_ERROR stops it)."""
        self._drop(stream)
        stream.closed = False  # still to be answered
        self.respond(stream, headers, b"", b"")
        if not stream.ended:
            out.append(frame(RST_STREAM, 0, stream.id, U32.pack(NO_ERROR)))
        self._finish(stream)
        self._blocked.pop(stream.id, None)

    def _drop(self, stream: Stream) -> None:
        """Forget a stream's body (it counts no more against the connection) and cancel
        whoever is answering it."""
        self._buffered -= stream.held
        stream.held = 0
        stream.body = []
        self._abandon(stream)

    def _abandon(self, stream: Stream) -> None:
        stream.closed = True
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()

    # -- responses -------------------------------------------------------------------------
    def respond(
        self, stream: Stream, headers: bytes, body: bytes, trailers: bytes, lead: bytes = b""
    ) -> None:
        """Send a response: HEADERS, then ``lead`` and ``body`` as DATA (as windows allow),
        then ``trailers`` with END_STREAM. Empty ``body`` and ``trailers``: headers end it.
        ``lead`` (a gRPC message's 5-byte prefix) goes out with a copy of the body's first
        bytes only, so that a large body is sent from views of it, never copied whole."""
        if stream.closed or self.transport is None or self.transport.is_closing():
            return
        if not body and not trailers:
            self._finish(stream)
            self._write(self._header_frames(stream.id, END_STREAM, headers))
            return
        out = [self._header_frames(stream.id, 0, headers)]
        if lead:
            whole = memoryview(body)
            split = min(len(whole), VIEW_FRAME - len(lead))
            stream.pending = memoryview(lead + whole[:split])  # one copy of the first bytes
            stream.rest = whole[split:] if split < len(whole) else None
        else:
            stream.pending = memoryview(body)
        stream.trailers = trailers
        self._send_pending(stream, out)
        self._write_out(out)

    def _send_pending(self, stream: Stream, out: list[bytes]) -> None:
        pending = stream.pending
        while pending:
            size = min(len(pending), self._send_window, stream.send_window, self._peer_max_frame)
            if size <= 0:
                stream.pending = pending
                self._blocked[stream.id] = stream
                ANSWERS.hold(self)  # counted in the process's unsent answers while it waits
                return
            if size >= VIEW_FRAME:
                out.append(frame_head(DATA, 0, stream.id, size))
                out.append(pending[:size])  # type: ignore[arg-type]  # bytes-like: see _write_out
                self._views = True
            else:
                out.append(frame(DATA, 0, stream.id, pending[:size].tobytes()))
            pending = pending[size:]
            self._send_window -= size
            stream.send_window -= size
            if not pending and stream.rest is not None:
                pending, stream.rest = stream.rest, None
        stream.pending = None
        if self._blocked.pop(stream.id, None) is not None:
            ANSWERS.released()  # an answer that waited for window is sent
        if stream.streaming:
            return  # more DATA, or end_stream, follows
        self._finish(stream)
        out.append(self._header_frames(stream.id, END_STREAM, stream.trailers))

    # -- responses sent piece by piece (gRPC server streaming) -----------------------------
    def open_stream(self, stream: Stream, headers: bytes) -> None:
        """Start a response sent in pieces: HEADERS now; ``send_data`` adds DATA as it
        comes, ``end_stream`` ends it with the trailers."""
        if stream.closed or self.transport is None or self.transport.is_closing():
            return
        stream.streaming = True
        self._write(self._header_frames(stream.id, 0, headers))

    def send_data(self, stream: Stream, data: bytes) -> None:
        """More DATA on an open stream, after what still waits for window (``pending``)."""
        if stream.closed or self.transport is None or self.transport.is_closing():
            return
        pending = stream.pending
        stream.pending = memoryview(pending.tobytes() + data if pending else data)
        out: list[bytes] = []
        self._send_pending(stream, out)
        if out:
            self._write_out(out)

    def end_stream(self, stream: Stream, trailers: bytes) -> None:
        """End an open stream: the trailers, with END_STREAM, after any pending DATA."""
        if stream.closed or self.transport is None or self.transport.is_closing():
            return
        stream.streaming = False
        stream.trailers = trailers
        if stream.pending is None:
            self._finish(stream)
            self._write(self._header_frames(stream.id, END_STREAM, trailers))

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

    def unsent(self) -> int:
        """Answer bytes not yet read by the peer: the answers waiting for window (whole:
        what is left of each is a view of it) and the transport's buffer
        (``transport.unsent.Holder``)."""
        held = sum(
            # Behind a lead, the answer whole is what ``rest`` views (``pending`` holds the
            # lead and a copy of the answer's first bytes).
            len(cast(bytes, (stream.pending if stream.rest is None else stream.rest).obj))
            for stream in self._blocked.values()
            if stream.pending is not None
        )
        buffered = 0 if self.transport is None else self.transport.get_write_buffer_size()
        if not buffered:
            self._biggest = 0
        # The transport keeps each write whole until its last byte is sent, and only the
        # first one in its buffer can be partly sent: at most the largest write more.
        return held + buffered + (self._biggest if buffered else 0)

    def _flush_blocked(self, out: list[bytes]) -> None:
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

    def _write_out(self, out: list[bytes]) -> None:
        """Write the frames a step gathered: joined into one write, or, when they hold
        views of an answer (``VIEW_FRAME``), as they are with ``writelines``, which keeps
        them as buffers until the kernel has taken them."""
        if not self._views:
            self._write(b"".join(out))
            return
        self._views = False
        transport = self.transport
        if transport is None:
            return
        size = sum(len(part) for part in out)
        if size > self._biggest:
            self._biggest = size
        transport.writelines(out)
        if self.going_away_sent and not self.streams:
            self._closed_by_us = True
            transport.close()

    def _write(self, data: bytes) -> None:
        """Write, then close if we are going away and this ended the last stream."""
        transport = self.transport
        if transport is None:
            return
        if len(data) > self._biggest:
            self._biggest = len(data)
        transport.write(data)
        if self.going_away_sent and not self.streams:
            self._closed_by_us = True
            transport.close()
