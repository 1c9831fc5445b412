"""``in_daemon_thread``: a blocking call awaited from the loop, in a daemon thread.

Not ``asyncio.to_thread``: the executor's threads are joined when the interpreter exits,
so a call that never returns (a user's ``load()`` waiting forever, a store that stays
silent) would keep the server from exiting on SIGTERM. The in-process model loads and the
remote artefacts' fetches (``remote_models``) use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

_Result = TypeVar("_Result")


async def in_daemon_thread(
    function: Callable[..., _Result], *args: Any, name: str = "inferpool-load"
) -> _Result:
    """``function(*args)`` in a new daemon thread, awaited."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_Result] = loop.create_future()

    def settle(result: _Result | None, error: BaseException | None) -> None:
        if done.done():  # the caller went away (shutdown cancelled it)
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(cast(_Result, result))

    def run() -> None:
        try:
            result, error = function(*args), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits now
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done
