"""The frontend's end of one streamed request in a worker: its replies as they come.

A ``StreamSink`` sits in its worker's in-flight map where a request's future would
(``WorkerHandle.drain_replies`` hands it each reply with ``set_result``, as a future's),
and puts itself back there while replies marked ``MORE`` come, so that ordinary requests
pay nothing for streams. Its consumer takes the replies with ``next``; every half window
it has taken, it returns that credit to the worker (``stream_ops.Credit``), which sends no
more than ``stream_ops.STREAM_WINDOW`` chunks ahead. ``close`` before the last reply cancels the
stream in the worker (its generator is closed). A worker that dies ends it: its handle
answers every in-flight entry with a 503, which is a last reply.

A stream that takes its client's whole stream (``Kind.GRPC_STREAM_IN``) is fed further
requests with ``feed`` (at most ``stream_ops.INPUT_WINDOW`` ahead of its runtime: the
worker's ``TOOK`` replies make room) and ``end_input``; ``fail`` ends it with an error of
its input (a request that names another model, say).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import TYPE_CHECKING

from inferpool.engine.ipc import messages, stream_ops
from inferpool.engine.ipc.messages import Reply
from inferpool.engine.ipc.stream_ops import INPUT_WINDOW, MORE, STREAM_WINDOW, TOOK

if TYPE_CHECKING:
    from inferpool.engine.pool.handles import WorkerHandle


class StreamSink:
    """One streamed request's replies, from its worker to its consumer."""

    __slots__ = (
        "closed", "ended", "replies", "request_id", "room", "taken", "waiter", "worker",
    )  # fmt: skip

    def __init__(self, worker: WorkerHandle, request_id: int) -> None:
        self.worker = worker
        self.request_id = request_id
        self.replies: collections.deque[Reply] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.ended = False  # its last reply came
        self.closed = False  # its consumer has gone: what comes now is dropped
        self.taken = 0  # chunks taken since the last credit
        self.room: asyncio.Semaphore | None = None  # requests it may be fed (made at the first)

    # -- the in-flight map's side (a future's interface) -----------------------------------
    def done(self) -> bool:
        return self.closed

    def set_result(self, reply: Reply) -> None:
        if reply.flags & MORE and not self.worker.closed:
            self.worker.inflight[self.request_id] = self  # type: ignore[assignment] # more to come
        else:
            self.ended = True
        if reply.flags & TOOK:  # no chunk: its runtime took a fed request
            if self.room is not None:
                self.room.release()
            return
        self._push(reply)

    def _push(self, reply: Reply) -> None:
        self.replies.append(reply)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the consumer's side ---------------------------------------------------------------
    async def next(self) -> Reply:
        """The next reply; the last one has no ``MORE`` flag."""
        while not self.replies:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        reply = self.replies.popleft()
        if reply.flags & MORE:
            self.taken += 1
            if self.taken >= STREAM_WINDOW // 2:
                self._send(stream_ops.Credit(request_id=self.request_id, chunks=self.taken))
                self.taken = 0
        return reply

    async def feed(self, body: bytes) -> None:
        """One more request for the stream, once its runtime has room for it."""
        if self.room is None:
            self.room = asyncio.Semaphore(INPUT_WINDOW)
        await self.room.acquire()
        if not (self.ended or self.closed):
            self._send(stream_ops.Feed(request_id=self.request_id, body=body))

    def end_input(self) -> None:
        """The client sends no more requests."""
        if not (self.ended or self.closed):
            self._send(stream_ops.EndInput(request_id=self.request_id))

    def fail(self, error: Reply) -> None:
        """End the stream with ``error`` (its last reply): its input went wrong."""
        if self.ended or self.closed:
            return
        self.close()  # cancelled in its worker; what it still sends is dropped
        self.closed = False  # (its consumer has not gone: it takes the error)
        self.ended = True
        self._push(error)

    def close(self) -> None:
        """The consumer is done: a stream still running is cancelled in its worker."""
        if self.closed:
            return
        self.closed = True
        if not self.ended:
            self.worker.inflight.pop(self.request_id, None)
            self._send(messages.Cancel(request_id=self.request_id))

    def _send(self, message: messages.Control) -> None:
        if self.worker.alive:
            with contextlib.suppress(OSError):  # it died: its EOF ends the stream
                self.worker.post_control(message)
