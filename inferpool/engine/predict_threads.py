"""``--workers 0``: predicts run in a few daemon threads, off the event loop.

In the server process a predict that hangs (or runs for minutes) on the event loop's
thread would stop everything: health checks, every other model. ``PredictThreads``
keeps ``1 + max_standby_workers`` threads (started at the first predict); each predict
runs in a free one while the loop goes on, and its caller is answered 504 at the model's
timeout. One model version runs one predict at a time, as in a worker process (a
runtime never sees two calls at once): its next requests wait on the loop, holding no
thread. So a model that hangs holds one thread, whatever number of its calls hang, and
``max_standby_workers`` hung models leave a thread to the others; past that, requests
wait for a thread (up to their deadline and their model's timeout). A thread cannot be
killed: a hung call keeps its thread until it returns. Different models predict side by
side when they release the GIL (the native kernels, LightGBM, NumPy). A thread is a
daemon: a hung call never keeps the process from exiting. ``--stall-threshold 0`` runs
predicts on the loop as before (no hop, no containment). docs/operate/containment.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from inferpool.errors import DeadlineExceeded

_Result = TypeVar("_Result")
_PREFIX = "inferpool-predict-"


class _Job:
    __slots__ = ("args", "context", "count", "function", "future", "key", "loop")

    def __init__(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        future: asyncio.Future[Any],
        key: str,
        count: int,
    ) -> None:
        self.function, self.args, self.future = function, args, future
        self.key, self.count = key, count
        self.loop = future.get_loop()
        # The caller's context (its request id, for the runtime's log records), as
        # ``asyncio.to_thread`` hands it on.
        self.context = contextvars.copy_context()


class PredictThreads:
    """A fixed set of daemon threads that run predicts for the event loop, one at a
    time per model version."""

    def __init__(self, count: int) -> None:
        self.count = max(1, count)
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        # Model versions with a predict in a thread (or handed to one), and the jobs of
        # each waiting for it to end: loop side only.
        self._waiting: dict[str, collections.deque[_Job]] = {}
        # What each thread runs now: (model version, requests), written by that thread
        # alone; the metrics' queued gauge counts the rest as waiting.
        self.running: list[tuple[str, int] | None] = [None] * self.count
        self._started = False
        # Threads started, and those blocked in a call to another model (``blocked``).
        self._threads = 0
        self._blocked = 0
        self._lock = threading.Lock()

    def submit(
        self, function: Callable[..., _Result], *args: Any, key: str, count: int = 1
    ) -> asyncio.Future[_Result]:
        """``function(*args)`` (``count`` requests of the model version ``key``) in a
        thread, once the version's previous predict has ended; its result in the future."""
        if not self._started:
            self._started = True
            for _ in range(self.count):
                self._start_thread()
        future: asyncio.Future[_Result] = asyncio.get_running_loop().create_future()
        job = _Job(function, args, future, key, count)
        waiting = self._waiting.get(key)
        if waiting is None:
            self._waiting[key] = collections.deque()
            self._jobs.put(job)
        else:
            waiting.append(job)
        return future

    def _next(self, key: str) -> None:
        """The version's predict ended: hand its next job (not given up on) to a thread."""
        waiting = self._waiting[key]
        while waiting:
            job = waiting.popleft()
            if not job.future.done():  # its caller went away, or its timeout passed
                self._jobs.put(job)
                return
        del self._waiting[key]

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
                    "call cannot be stopped and holds one of the "
                    f"{self.count} predict threads until it returns"
                )
            )

    def _start_thread(self) -> None:
        with self._lock:
            number = self._threads
            self._threads += 1
            if number >= len(self.running):
                self.running.append(None)
        name = f"{_PREFIX}{number}"
        threading.Thread(target=self._serve, args=(number,), name=name, daemon=True).start()

    def current_key(self) -> str | None:
        """The model version whose predict runs in this thread (None: not a predict thread)."""
        name = threading.current_thread().name
        if not name.startswith(_PREFIX):
            return None
        entry = self.running[int(name[len(_PREFIX) :])]
        return None if entry is None else entry[0]

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        """This thread waits for another model's predict (``engine/call_server.py``): one
        more thread is started while fewer than ``count`` are free of such waits, so that
        the callee (and other models) find one. The threads started so stay."""
        with self._lock:
            self._blocked += 1
            short = self._threads - self._blocked < self.count
        if short:
            self._start_thread()
        try:
            yield
        finally:
            with self._lock:
                self._blocked -= 1

    def _serve(self, number: int) -> None:
        while True:
            job = self._jobs.get()
            self.running[number] = (job.key, job.count)
            try:
                result, error = job.context.run(job.function, *job.args), None
            except BaseException as exc:  # handed to the awaiting coroutine
                result, error = None, exc
            self.running[number] = None
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits now
                job.loop.call_soon_threadsafe(self._settle, job, result, error)
            del job, result, error  # nothing of it kept while idle

    def _settle(self, job: _Job, result: Any, error: BaseException | None) -> None:
        future = job.future
        if not future.done():  # else its caller went away, or its timeout passed
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        self._next(job.key)
