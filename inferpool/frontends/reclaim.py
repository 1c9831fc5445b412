"""The memory of HTTP/1.1 connections cut off with answers unsent, given back soon.

An answer a peer never reads stays in its transport's write buffer until the transport
is freed. Uvicorn's protocol, its request cycle, their flow control and the transport
refer to one another, so an aborted connection is freed by the cyclic garbage collector
only, and a full collection comes rarely in a long-lived process with a big heap.
Measured here: after a few hundred requests of other kinds, a server kept three unread
40 MB answers (114 MiB) with no connection left, until a collection ran. So a connection
cut off with unsent data asks for one full collection a moment later: at most one per
``COLLECT_DELAY``, however many are cut off meanwhile (a full collection of the frontend's
heap costs milliseconds; a peer cannot make it run more often than that).
"""

from __future__ import annotations

import asyncio
import gc

COLLECT_DELAY = 1.0  # seconds: connection_lost and the request's task have finished by then

_scheduled: asyncio.TimerHandle | None = None


def collect_soon(loop: asyncio.AbstractEventLoop) -> None:
    """Run one full garbage collection ``COLLECT_DELAY`` from now, unless one is due."""
    global _scheduled
    if _scheduled is None:
        _scheduled = loop.call_later(COLLECT_DELAY, _collect)


def _collect() -> None:
    global _scheduled
    _scheduled = None
    gc.collect()
