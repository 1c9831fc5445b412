"""Feeding a client's whole stream into one running ``predict_stream``, on the frontend's
side: the requests it sends after its first, as they come, then the end of its input.

``feeding`` runs a task beside the stream's consumer that takes each request of the
client's iterator and hands it to the stream (``Feeder.feed``, which waits while its
runtime has ``INPUT_WINDOW`` not taken yet: the client is then not read, and its gRPC
server's flow control or bound on unread messages holds it), then ``end_input``. An
error of the input (``more`` raises: a request naming another model, say) ends the
stream with that error as its last reply (``Feeder.fail``). The task ends with the
stream: its consumer leaving, or its last reply.

A worker's stream is fed through its ``StreamSink`` (control messages); with
``workers=0``, ``LocalFeed`` puts the requests in the stream's ``StreamInput`` directly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from inferpool.engine.ipc.messages import Reply
from inferpool.engine.ipc.stream_ops import INPUT_WINDOW, MORE
from inferpool.errors import ClientGone, InferpoolError

if TYPE_CHECKING:  # (the frontend of a worker pool does not load the worker's modules)
    from inferpool.engine.worker.stream_input import StreamInput


class Feeder(Protocol):
    """Where a stream's further requests go."""

    def feed(self, body: bytes) -> Awaitable[None]: ...
    def end_input(self) -> None: ...
    def fail(self, error: Reply) -> None: ...


async def _feed_all(more: AsyncIterator[bytes], feeder: Feeder) -> None:
    try:
        async for body in more:
            await feeder.feed(body)
    except InferpoolError as exc:
        feeder.fail(Reply.from_error(exc))
        return
    except Exception as exc:  # the client's side of the call broke
        feeder.fail(Reply.from_error(ClientGone(f"the client's stream broke: {exc}")))
        return
    feeder.end_input()


@contextlib.asynccontextmanager
async def feeding(more: AsyncIterator[bytes] | None, feeder: Feeder) -> AsyncGenerator[None, None]:
    """Feed ``more`` into the stream while the block consumes its replies (no-op: None)."""
    if more is None:
        yield
        return
    task = asyncio.get_running_loop().create_task(_feed_all(more, feeder))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class LocalFeed:
    """The feeder of a stream running in this process (``workers=0``), and the failure of
    its input raced against its next reply."""

    __slots__ = ("failed", "input", "room")

    def __init__(self) -> None:
        from inferpool.engine.worker.stream_input import StreamInput

        self.room = asyncio.Semaphore(INPUT_WINDOW)
        self.input: StreamInput = StreamInput(self.room.release)
        self.failed: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

    async def feed(self, body: bytes) -> None:
        await self.room.acquire()
        if not self.failed.done():
            self.input.put(body)

    def end_input(self) -> None:
        self.input.end()

    def fail(self, error: Reply) -> None:
        if not self.failed.done():
            self.failed.set_result(error)

    async def next(self, replies: AsyncGenerator[Reply, None]) -> Reply:
        """The stream's next reply, or its input's error if that comes first (the stream
        is then cancelled: ``stream_replies`` closes its generator). Raises
        StopAsyncIteration after the last."""
        if not self.failed.done():
            step = asyncio.ensure_future(anext(replies))
            try:
                await asyncio.wait((step, self.failed), return_when=asyncio.FIRST_COMPLETED)
            finally:  # the input failed, or this consumer was cancelled: the stream too
                running = not step.done()
                if running:
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await step
            if not running:
                return step.result()
        return self.failed.result()


def local_replies(
    start: Callable[[AsyncIterator[bytes] | None], AsyncGenerator[Reply, None]],
    more: AsyncIterator[bytes] | None,
) -> AsyncGenerator[Reply, None]:
    """The replies of a stream run here by ``start(bodies)``, fed ``more`` (if not None)."""
    if more is None:
        return start(None)
    return _fed_locally(start, more)


async def _fed_locally(
    start: Callable[[AsyncIterator[bytes] | None], AsyncGenerator[Reply, None]],
    more: AsyncIterator[bytes],
) -> AsyncGenerator[Reply, None]:
    feed = LocalFeed()
    replies = start(feed.input.bodies())
    try:
        async with feeding(more, feed):
            while True:
                try:
                    reply = await feed.next(replies)
                except StopAsyncIteration:
                    return
                yield reply
                if not reply.flags & MORE:
                    return
    finally:
        await replies.aclose()
