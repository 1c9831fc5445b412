"""``--workers 0``'s predict threads: off the loop, one call at a time per model version,
a hung call holding one thread only, 504 at the timeout, given-up calls never run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from inferpool.engine.predict_threads import PredictThreads
from inferpool.errors import DeadlineExceeded


def blocking(release: threading.Event) -> tuple[list[Any], Callable[[Any], Any]]:
    """A call that notes its argument, waits for ``release``, then returns the argument;
    and the list of the arguments of the calls that started."""
    started: list[Any] = []

    def call(argument: Any) -> Any:
        started.append(argument)
        release.wait(10)
        return argument

    return started, call


def test_calls_run_off_the_loop_and_return_or_raise() -> None:
    threads = PredictThreads(2)

    async def run() -> None:
        loop_thread = threading.get_ident()
        assert await threads.submit(threading.get_ident, key="m") != loop_thread
        with pytest.raises(ZeroDivisionError):
            await threads.submit(lambda: 1 / 0, key="m")

    asyncio.run(run())


def test_a_hung_model_holds_one_thread_and_the_others_go_on() -> None:
    """Three calls of a model that blocks: one runs, two wait on the loop (no thread);
    another model's calls run meanwhile, in the second thread."""
    threads, release = PredictThreads(2), threading.Event()
    started, hang = blocking(release)

    async def run() -> None:
        hung = [threads.submit(hang, f"h{i}", key="hung") for i in range(3)]
        for i in range(5):
            assert await asyncio.wait_for(threads.submit(str, i, key="other"), 5) == str(i)
        assert started == ["h0"]  # one at a time for the hung model
        assert threads.running_by_key() == {"hung": 1}
        release.set()
        assert await asyncio.gather(*hung) == ["h0", "h1", "h2"]  # in order, then

    asyncio.run(run())


def test_past_its_timeout_a_call_is_deadline_exceeded_and_a_waiting_one_never_runs() -> None:
    threads, release = PredictThreads(2), threading.Event()
    ran, call = blocking(release)

    async def run() -> None:
        first = threads.submit(call, 1, key="m")
        second = threads.submit(call, 2, key="m")  # waits for the first
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match=r"'m' ran longer than its timeout \(0.2 s\)"):
            await threads.wait(first, 0.2, "'m'")
        assert 0.15 < time.monotonic() - started < 2
        with pytest.raises(DeadlineExceeded):
            await threads.wait(second, 0.1, "'m'")
        release.set()
        third = threads.submit(call, 3, key="m")
        assert await threads.wait(third, 5, "'m'") == 3

    asyncio.run(run())
    assert ran == [1, 3]  # the second was given up on before its turn


def test_a_thread_waiting_in_a_call_gets_a_spare_and_knows_its_model() -> None:
    """One thread: a predict that waits for another model's predict (a call,
    ``engine/call_server.py``) would hold it; ``blocked`` starts another."""
    threads = PredictThreads(1)

    async def run() -> tuple[str | None, str | None]:
        loop = asyncio.get_running_loop()

        async def callee() -> str | None:
            return await threads.submit(threads.current_key, key="callee")

        def caller() -> tuple[str | None, str | None]:
            key = threads.current_key()
            with threads.blocked():
                return key, asyncio.run_coroutine_threadsafe(callee(), loop).result(5)

        return await threads.submit(caller, key="caller")

    assert asyncio.run(run()) == ("caller", "callee")
    assert threads.current_key() is None  # not a predict thread
