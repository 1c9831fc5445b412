"""Memory that answers held for clients took, given back soon: HTTP/1.1 connections cut
off with answers unsent, and the heap's free pages once held answers are freed.

An answer a peer never reads stays in its transport's write buffer until the transport
is freed. Uvicorn's protocol, its request cycle, their flow control and the transport
refer to one another, so an aborted connection is freed by the cyclic garbage collector
only, and a full collection comes rarely in a long-lived process with a big heap.
Measured here: after a few hundred requests of other kinds, a server kept three unread
40 MB answers (114 MiB) with no connection left, until a collection ran. So a connection
cut off with unsent data asks for one full collection a moment later: at most one per
``COLLECT_DELAY``, however many are cut off meanwhile (a full collection of the frontend's
heap costs milliseconds; a peer cannot make it run more often than that).

Answers of less than 1 MiB come from the heap (``allocator.py``), and glibc gives back
only the free memory at the heap's top: a burst of such answers refused or sent to slow
readers, freed in any order, stayed in the frontend's RSS (80 MiB after 143 answers of
576 KB refused at once, here). ``trim_soon`` returns it: one ``malloc_trim(0)`` a moment
after answers held for slow readers were freed (``transport/unsent.py`` calls it), at most
one per ``COLLECT_DELAY``. It costs about 0.15 ms on a heap with nothing to give back,
and 55 ms to give back 80 MiB.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import platform
from collections.abc import Callable

COLLECT_DELAY = 1.0  # seconds: connection_lost and the request's task have finished by then

_scheduled: asyncio.TimerHandle | None = None
_trim_scheduled: asyncio.TimerHandle | None = None


def collect_soon(loop: asyncio.AbstractEventLoop) -> None:
    """Run one full garbage collection ``COLLECT_DELAY`` from now, unless one is due."""
    global _scheduled
    if _scheduled is None:
        _scheduled = loop.call_later(COLLECT_DELAY, _collect)


def _collect() -> None:
    global _scheduled
    _scheduled = None
    gc.collect()


def _malloc_trim() -> Callable[[int], int] | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


MALLOC_TRIM = _malloc_trim()


def trim_soon() -> None:
    """Give the heap's free pages back ``COLLECT_DELAY`` from now, unless a trim is due
    (glibc only; called on the running loop)."""
    global _trim_scheduled
    if _trim_scheduled is None and MALLOC_TRIM is not None:
        _trim_scheduled = asyncio.get_running_loop().call_later(COLLECT_DELAY, _trim)


def _trim() -> None:
    global _trim_scheduled
    _trim_scheduled = None
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


class PeriodicTrim:
    """``malloc_trim(0)`` every ``period`` seconds on the running loop, until ``cancel``.

    For the grpc.aio server, whose connections and answers C-core holds where the frontend
    cannot see them: the memory its threads freed stays in their glibc arenas. Measured
    here, after a peer that never opened its window made it hold 150 answers of 576 KB,
    the frontend kept +146 MiB once the connection had closed, and +2 MiB after one trim.
    A trim costs about 0.15 ms when there is nothing to give back.
    """

    def __init__(self, period: float) -> None:
        self.period = period
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if MALLOC_TRIM is not None:
            self._handle = asyncio.get_running_loop().call_later(self.period, self._run)

    def _run(self) -> None:
        if MALLOC_TRIM is not None:
            MALLOC_TRIM(0)
        self._handle = asyncio.get_running_loop().call_later(self.period, self._run)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
