"""The input of a stream that takes its client's whole stream (``Kind.GRPC_STREAM_IN``):
the requests the client sends after its first, as they come.

MLServer hands a gRPC ModelStreamInfer call's requests to one ``predict_stream`` call, as
an async iterator that yields each request when the client sends it. ``StreamInput`` is
that iterator's source where the stream runs (a worker's streams loop, or the server's
loop with ``workers=0``): the frontend feeds bodies in (``put``), then the end of input
(``end``); ``bodies`` yields them to the payload iterator of ``streaming.stream_replies``,
calling ``took`` as the runtime takes each one: the feeder may then feed one more (a
worker's frontend hears it in a ``TOOK`` reply; ``workers=0`` releases its semaphore), so
that at most ``INPUT_WINDOW`` requests wait here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from inferpool.engine.ipc.stream_ops import INPUT_WINDOW

_END = None  # the queue's marker for the end of input


class StreamInput:
    """The requests fed into one running stream (the module's text)."""

    __slots__ = ("_queue", "took")

    def __init__(self, took: Callable[[], None] | None = None) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.took = took

    def put(self, body: bytes) -> None:
        """One more request; a feeder past its window is a bug, refused (RuntimeError)."""
        if self._queue.qsize() >= INPUT_WINDOW:
            raise RuntimeError(f"more than {INPUT_WINDOW} requests fed ahead of the runtime")
        self._queue.put_nowait(body)

    def end(self) -> None:
        """The client sends no more requests."""
        self._queue.put_nowait(_END)

    async def bodies(self) -> AsyncIterator[bytes]:
        """The fed requests' bodies, each when it comes, until the end of input."""
        while True:
            body = await self._queue.get()
            if body is _END:
                return
            if self.took is not None:
                self.took()
            yield body
