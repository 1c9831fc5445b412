"""How the REST frontend awaits the engine: until the answer, the request's deadline, or
its client's disconnect, whichever comes first. A deadline or a disconnect cancels the
engine call, so a request still queued is dropped by its worker (pool ``_infer``).

Under Uvicorn the guarded protocol (``http1.py``) marks the scope with ``WATCH`` and
cancels a watched call itself when its connection closes: no task per request. Other
servers (Hypercorn) get a small race between the call and ``receive()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from starlette.types import Receive, Scope

from inferpool.errors import DeadlineExceeded
from inferpool.frontends.rest.body import client_gone

# Scope key set by a server that cancels a watched engine call on disconnect (http1.py):
# 0 while nothing is watched, WATCHING while the app awaits the engine, GONE once the
# protocol has cancelled that await because the client went away.
WATCH = "inferpool.watch"
WATCHING = 1
GONE = 2


async def await_reply(
    scope: Scope, receive: Receive, call: Coroutine[Any, Any, Any], timeout: float | None
) -> Any:
    """``call``'s result, unless the deadline passes (504) or the client goes away first."""
    if WATCH not in scope:
        return await _race(receive, call, timeout)
    scope[WATCH] = WATCHING
    try:
        if timeout is None:
            return await call
        async with asyncio.timeout(timeout):
            return await call
    except TimeoutError:
        raise _deadline(timeout) from None
    except asyncio.CancelledError:
        if scope.get(WATCH) != GONE:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        raise client_gone("while its request was queued or running") from None
    finally:
        if scope[WATCH] == WATCHING:
            scope[WATCH] = 0


async def _race(receive: Receive, call: Coroutine[Any, Any, Any], timeout: float | None) -> Any:
    task = asyncio.ensure_future(call)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        done, _ = await asyncio.wait(
            (task, gone), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()  # the deadline, the disconnect, or our own cancellation
    if task in done:
        return task.result()
    if gone in done:
        raise client_gone("while its request was queued or running")
    raise _deadline(timeout)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _deadline(timeout: float | None) -> DeadlineExceeded:
    return DeadlineExceeded(f"the request's deadline ({timeout:g}s) passed before its answer")
