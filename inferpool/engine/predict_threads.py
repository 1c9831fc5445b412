"""``--workers 0``: predicts run in a few daemon threads, off the event loop.

In the server process a predict that hangs (or runs for minutes) on the event loop's
thread would stop everything: health checks, every other model. ``PredictThreads``
keeps ``1 + max_standby_workers`` threads (started at the first predict): each predict
runs in a free one while the loop goes on, and its caller is answered 504 at the model's
timeout. A thread cannot be killed: one whose call hangs stays held until the call
returns, so ``max_standby_workers`` hung calls leave one thread serving the others; past
that, requests wait for a thread (up to their deadline and the model's timeout). Models
that release the GIL (the native kernels, LightGBM, NumPy) predict side by side; pure
Python ones take turns, as on the loop. A thread is a daemon: a hung call never keeps the
process from exiting. ``--stall-threshold 0`` runs predicts on the loop as before (no
hop; no containment). docs/operate/containment.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from inferpool.errors import DeadlineExceeded

_Result = TypeVar("_Result")
_Job = tuple[
    Callable[..., Any], tuple[Any, ...], asyncio.Future[Any], asyncio.AbstractEventLoop, str, int
]


class PredictThreads:
    """A fixed set of daemon threads that run predicts for the event loop."""

    def __init__(self, count: int) -> None:
        self.count = max(1, count)
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        # What each thread runs now: (model version, requests), written by that thread
        # alone; the metrics' queued gauge counts the rest as waiting.
        self.running: list[tuple[str, int] | None] = [None] * self.count
        self._started = False

    def submit(
        self, function: Callable[..., _Result], *args: Any, key: str, count: int = 1
    ) -> asyncio.Future[_Result]:
        """``function(*args)`` (``count`` requests of the model version ``key``) in a free
        thread; its result (or error) in the future."""
        if not self._started:
            self._started = True
            for number in range(self.count):
                name = f"inferpool-predict-{number}"
                threading.Thread(target=self._serve, args=(number,), name=name, daemon=True).start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Result] = loop.create_future()
        self._jobs.put((function, args, future, loop, key, count))
        return future

    def running_by_key(self) -> dict[str, int]:
        """Per model version, the requests the threads are running now."""
        counts: dict[str, int] = {}
        for entry in list(self.running):
            if entry is not None:
                counts[entry[0]] = counts.get(entry[0], 0) + entry[1]
        return counts

    async def wait(
        self, future: asyncio.Future[_Result], timeout: float | None, what: str
    ) -> _Result:
        """Await a submitted call for at most ``timeout`` seconds (None: no limit); past it
        DeadlineExceeded naming ``what`` (the call goes on in its thread, its result is
        dropped)."""
        if timeout is None:
            return await future
        # A timer, not ``asyncio.wait_for``: a third of the cost per call.
        timer = asyncio.get_running_loop().call_later(timeout, self._expire, future, timeout, what)
        try:
            return await future
        finally:
            timer.cancel()

    def _expire(self, future: asyncio.Future[Any], timeout: float, what: str) -> None:
        if not future.done():
            future.set_exception(
                DeadlineExceeded(
                    f"{what} ran longer than its timeout ({timeout:g} s); with --workers 0 its "
                    f"call cannot be stopped and holds one of the {self.count} predict threads "
                    "until it returns"
                )
            )

    def _serve(self, number: int) -> None:
        while True:
            function, args, future, loop, key, count = self._jobs.get()
            self.running[number] = (key, count)
            try:
                result, error = function(*args), None
            except BaseException as exc:  # handed to the awaiting coroutine
                result, error = None, exc
            self.running[number] = None
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits now
                loop.call_soon_threadsafe(_settle, future, result, error)
            del function, args, future, result, error  # nothing of it kept while idle


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # its caller went away, or its timeout passed
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
