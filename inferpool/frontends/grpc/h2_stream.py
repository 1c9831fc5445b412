"""ModelStreamInfer on inferpool's HTTP/2 layer: a bidirectional gRPC call.

The call starts at the request's HEADERS (``GrpcH2Server._on_headers``), not at its end:
its DATA reaches ``MessageReader`` as it comes (``Stream.on_data``), which cuts it into
gRPC's length-prefixed messages, and ``serve_stream`` answers each one through
``InferenceService.stream_infer``: HEADERS at the first answer, a DATA message per
ModelStreamInferResponse, the trailers when the client has ended its side and every
request is answered. The next answer is written only once the last one has left
(the peer's flow-control window), and at most ``max_body_bytes`` of requests wait
unread, so a client that does not read, or floods, cannot grow the server's memory.
A reset stream cancels the call (the model's generator is closed); its deadline
(``grpc-timeout``) ends it with DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from inferpool.frontends.grpc.compression import (
    GZIP_HEADERS,
    BadMessage,
    ResponseGzip,
    accepts_gzip,
    inflate,
)
from inferpool.frontends.grpc.h2_call import (
    OK_TRAILERS,
    RESPONSE_HEADERS,
    CallError,
    framed,
    status_trailers,
    stream_status,
    too_large,
)
from inferpool.frontends.grpc.observer import CallObserver
from inferpool.transport.http2 import Http2Connection
from inferpool.transport.http2_streams import Stream

# How often a call whose last answer waits for the peer's window looks again (seconds).
WINDOW_POLL = 0.002


class StreamService(Protocol):
    """What answers a bidirectional call: ``InferenceService`` (ModelStreamInfer) or
    ``reflection.ReflectionStream`` (ServerReflectionInfo)."""

    def stream_infer(
        self, requests: AsyncIterator[bytes], deadline: float | None, metadata: Any = ()
    ) -> AsyncIterator[bytes]: ...


class MessageReader:
    """The request messages of a client-streaming call, as its DATA arrives."""

    def __init__(self, limit: int, encoding: bytes | None = None) -> None:
        self.limit = limit  # bytes per message, and waiting unread in all
        self.encoding = encoding  # the call's grpc-encoding, for messages flagged compressed
        self._buffer = bytearray()
        self._messages: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._ended = False
        self._error: CallError | None = None
        self._waiter: asyncio.Future[None] | None = None

    def feed(self, data: bytes, end: bool) -> None:
        """More DATA (``Stream.on_data``); ``end``: the client has ended its side."""
        if self._error is None:
            self._buffer += data
            self._cut()
            if end and self._buffer and self._error is None:
                self._error = CallError("INTERNAL", "the stream ended inside a message")
        self._ended = self._ended or end
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _cut(self) -> None:
        buffer = self._buffer
        while len(buffer) >= 5:
            flag = buffer[0]
            if flag > 1:
                message = f"invalid compressed flag {flag} of a message prefix"
                self._error = CallError("INTERNAL", message)
                return
            length = int.from_bytes(buffer[1:5], "big")
            if length > self.limit:
                self._error = CallError("RESOURCE_EXHAUSTED", too_large(length, self.limit))
                return
            if len(buffer) < 5 + length:
                break
            payload = bytes(buffer[5 : 5 + length])
            if flag:
                try:
                    payload = inflate(payload, self.encoding, self.limit)
                except BadMessage as exc:
                    self._error = CallError(exc.code, exc.message)
                    return
            self._messages.append(payload)
            self._queued += len(payload)  # inflated: what waits in memory
            del buffer[: 5 + length]
        if self._queued + len(buffer) > self.limit:
            message = f"over {self.limit} bytes of request messages wait unanswered"
            self._error = CallError("RESOURCE_EXHAUSTED", message)

    def __aiter__(self) -> MessageReader:
        return self

    async def __anext__(self) -> bytes:
        while True:
            if self._messages:
                message = self._messages.popleft()
                self._queued -= len(message)
                return message
            if self._error is not None:
                raise self._error
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter


async def serve_stream(
    service: StreamService,
    connection: Http2Connection,
    stream: Stream,
    reader: MessageReader,
    expires: float | None,
    observer: CallObserver,
    peer: str | None,
    gzip: ResponseGzip | None = None,
    method: str = "ModelStreamInfer",
) -> None:
    """One ModelStreamInfer (or other bidirectional ``method``) call, to its trailers (the
    module's text); ``gzip``: the server's response compression (None: off), for a client
    that accepts gzip."""
    started = time.perf_counter()
    code, text, pushback = "OK", "", 0
    opened = False
    if gzip is not None and not accepts_gzip(stream.headers):
        gzip = None
    head = RESPONSE_HEADERS + GZIP_HEADERS if gzip is not None else RESPONSE_HEADERS
    try:
        remaining = None if expires is None else max(0.0, expires - time.monotonic())
        async with asyncio.timeout(remaining):
            async for message in service.stream_infer(reader, expires, stream.headers):
                while stream.pending is not None and not stream.closed:
                    await asyncio.sleep(WINDOW_POLL)  # the last answer waits for window
                if not opened:
                    connection.open_stream(stream, head)
                    opened = True
                data = gzip.framed(stream.headers, message) if gzip is not None else None
                connection.send_data(stream, framed(message) if data is None else data)
    except (Exception, asyncio.CancelledError) as exc:
        code, text, pushback = stream_status(exc, stream, method)
        if code == "CANCELLED":
            raise
    finally:
        if observer.log:
            observer.stream_finished(method, stream.headers, peer, code, started)
    trailers = OK_TRAILERS if code == "OK" else status_trailers(code, text, pushback)
    if opened:
        connection.end_stream(stream, trailers)
    else:
        connection.respond(stream, RESPONSE_HEADERS + trailers, b"", b"")
