"""Supervision's decisions without processes: fake worker handles and a fake pool.

Which worker is killed for silence, which group is answered 504 and its worker
recycled, when a model is quarantined (three crashes it caused in 60 s, not an outside
SIGKILL), the back-off between starts, and the reason a wedged pool gives.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest

from inferpool.engine.ipc.messages import Reply
from inferpool.engine.pool import crashes
from inferpool.engine.pool.crashes import QUARANTINE_WINDOW, CrashBook, ExitStatuses
from inferpool.engine.pool.outages import MAX_BACKOFF, WEDGED_AFTER, Outages, backoff
from inferpool.engine.pool.supervisor import Supervisor
from inferpool.settings import ServerSettings


class FakeRequests:
    def __init__(self, running: tuple[int, list[int], int] | None) -> None:
        self._running = running

    def running(self) -> tuple[int, list[int], int] | None:
        return self._running


class FakeWorker:
    def __init__(
        self, silent_for: float = 0.0, running: tuple[int, list[int], int] | None = None
    ) -> None:
        self.pid = 0  # nothing to signal
        self.last_seen = time.monotonic() - silent_for
        self.requests = FakeRequests(running)
        self.inflight: dict[int, Any] = {}
        self.loading = None  # no load under way

    def describe(self) -> str:
        return "worker 0 (pid 0)"


class FakePool:
    """The PoolEvents side: model 1 has a timeout of 1 s, model 2 none."""

    def __init__(self) -> None:
        self.quarantined: list[tuple[int, str]] = []

    def timeout_of(self, model_index: int) -> float:
        return 1.0 if model_index == 1 else 0.0

    def model_name(self, model_index: int) -> str | None:
        return {1: "timed", 2: "plain"}.get(model_index)

    def quarantine(self, model_index: int, reason: str) -> None:
        self.quarantined.append((model_index, reason))


def supervisor(heartbeat: float = 30.0) -> tuple[Supervisor, FakePool, list[tuple[str, bool]]]:
    pool = FakePool()
    settings = ServerSettings(workers=2, worker_heartbeat_timeout=heartbeat)
    chief = Supervisor(settings, pool, lambda: False)  # type: ignore[arg-type]
    killed: list[tuple[str, bool]] = []
    chief.kill = lambda worker, reason, crash: killed.append((reason, crash))  # type: ignore[method-assign]
    return chief, pool, killed


def started_ns(seconds_ago: float) -> int:
    return int((time.monotonic() - seconds_ago) * 1e9)


# -- heartbeats ------------------------------------------------------------------------------
def test_a_silent_idle_worker_is_killed_and_a_talking_one_is_not() -> None:
    chief, _, killed = supervisor(heartbeat=30.0)
    now = time.monotonic()
    chief.watchdog.check(FakeWorker(silent_for=5), now)  # type: ignore[arg-type]
    assert killed == []
    chief.watchdog.check(FakeWorker(silent_for=31), now)  # type: ignore[arg-type]
    assert killed == [("worker 0 (pid 0) exited", False)]


def test_a_silent_worker_busy_within_its_models_timeout_is_left_alone() -> None:
    chief, _, killed = supervisor(heartbeat=30.0)
    now = time.monotonic()
    busy = FakeWorker(silent_for=31, running=(1, [5], started_ns(0.5)))
    chief.watchdog.check(busy, now)  # type: ignore[arg-type]
    assert killed == []
    # A model without a timeout gets no such leeway: silence is a hang.
    chief.watchdog.check(FakeWorker(silent_for=31, running=(2, [5], started_ns(40))), now)  # type: ignore[arg-type]
    assert killed == [("worker 0 (pid 0) exited", False)]


def test_no_heartbeat_timeout_kills_no_silent_worker() -> None:
    chief, _, killed = supervisor(heartbeat=0.0)
    chief.watchdog.check(FakeWorker(silent_for=3600), time.monotonic())  # type: ignore[arg-type]
    assert killed == []


# -- timeouts --------------------------------------------------------------------------------
def test_a_group_past_its_models_timeout_gets_504_and_its_worker_is_recycled() -> None:
    chief, _, killed = supervisor()

    async def run() -> list[Reply]:
        loop = asyncio.get_running_loop()
        worker = FakeWorker(running=(1, [11, 12], started_ns(1.5)))
        futures = [loop.create_future() for _ in range(3)]
        worker.inflight = dict(zip((11, 12, 13), futures, strict=True))
        chief.watchdog.check(worker, time.monotonic())  # type: ignore[arg-type]
        assert list(worker.inflight) == [13]  # not in the group: the kill answers it
        return [future.result() for future in futures[:2]]

    replies = asyncio.run(run())
    assert [reply.status for reply in replies] == [504, 504]
    assert b"model 'timed' ran longer than its timeout (1 s)" in replies[0].body
    [(reason, crash)] = killed
    assert "was recycled" in reason and not crash


def test_a_group_within_its_timeout_or_without_one_runs_on() -> None:
    chief, _, killed = supervisor()
    now = time.monotonic()
    chief.watchdog.check(FakeWorker(running=(1, [1], started_ns(0.5))), now)  # type: ignore[arg-type]
    chief.watchdog.check(FakeWorker(running=(2, [1], started_ns(600))), now)  # type: ignore[arg-type]
    assert killed == []


# -- quarantine ------------------------------------------------------------------------------
SEGV = signal.SIGSEGV  # a waitpid status: killed by SIGSEGV
KILL = signal.SIGKILL


def test_three_crashes_the_model_caused_within_the_window_quarantine_it(monkeypatch) -> None:
    monkeypatch.setattr(crashes, "oom_kills", lambda: 0)
    book = CrashBook()
    now = 1000.0
    assert book.count("w", "m", [1], SEGV, now) is None
    assert book.count("w", "m", [2], SEGV, now + 1) is None
    assert book.count("w", "other", [3], SEGV, now + 2) is None  # counted per model
    reason = book.count("w", "m", [4], SEGV, now + 2)
    assert reason == (
        "quarantined: its requests crashed workers 3 times in 60 s: killed by signal SIGSEGV"
    )
    book.forget("m")  # loaded again: the count starts over
    assert book.count("w", "m", [5], SEGV, now + 3) is None


def test_crashes_spread_beyond_the_window_do_not_quarantine(monkeypatch) -> None:
    monkeypatch.setattr(crashes, "oom_kills", lambda: 0)
    book = CrashBook()
    for n in range(6):
        assert book.count("w", "m", [n], SEGV, 1000.0 + n * (QUARANTINE_WINDOW / 2 + 1)) is None


def test_an_outside_sigkill_never_quarantines(monkeypatch) -> None:
    monkeypatch.setattr(crashes, "oom_kills", lambda: 7)  # the OOM killer did nothing
    book = CrashBook()
    for n in range(5):
        assert book.count("w", "m", [n], KILL, 1000.0 + n) is None
    assert book.count("w", "m", [9], 15 << 8, 1010.0) is None  # an error exit: the first count


def test_the_supervisor_quarantines_through_the_pool(monkeypatch) -> None:
    monkeypatch.setattr(crashes, "oom_kills", lambda: 0)
    chief, pool, _ = supervisor()
    for _ in range(3):
        chief.blame.count_crash(FakeWorker(), 2, [1], SEGV)  # type: ignore[arg-type]
    [(index, reason)] = pool.quarantined
    assert index == 2 and reason.startswith("quarantined: its requests crashed workers 3 times")


def test_exit_statuses_reach_whoever_waits_for_them() -> None:
    exits = ExitStatuses()
    exits.reported(10, SEGV)
    assert exits.take(10) == SEGV and exits.take(10) is None

    async def run() -> tuple[int | None, int | None]:
        waiting = asyncio.ensure_future(exits.wait(11, 1.0))
        await asyncio.sleep(0)
        exits.reported(11, KILL)
        return await waiting, await exits.wait(12, 0.01)

    assert asyncio.run(run()) == (KILL, None)


# -- back-off and liveness -------------------------------------------------------------------
def test_backoff_doubles_from_a_tenth_of_a_second_and_is_capped() -> None:
    assert [backoff(n) for n in range(5)] == [0.05, 0.1, 0.2, 0.4, 0.8]
    assert backoff(0, first=0.0) == 0.0
    assert backoff(40) == MAX_BACKOFF


def test_a_slot_backs_off_only_while_its_workers_die_quickly() -> None:
    outages = Outages(2)
    now = time.monotonic()
    assert outages.worker_delay(0, attempt=0) == 0.05
    outages.worker_died(0, quick=True, now=now)
    outages.worker_died(0, quick=True, now=now)
    assert outages.worker_delay(0, attempt=0) == 0.2
    assert outages.worker_delay(0, attempt=1) == 0.4  # a failed start counts too
    assert outages.worker_delay(1, attempt=0) == 0.05  # per slot
    outages.worker_died(0, quick=False, now=now)  # it had served a while: start over
    assert outages.worker_delay(0, attempt=0) == 0.05


def test_a_template_that_dies_quickly_restarts_later_each_time() -> None:
    outages = Outages(1)
    now = 1000.0
    outages.template_up(now - 60)
    assert outages.template_delay(now) == 0.0  # it had run a while
    outages.template_up(now)
    assert outages.template_delay(now + 1) == 0.1
    outages.template_up(now + 2)
    assert outages.template_delay(now + 3) == 0.2


@pytest.mark.parametrize("error", ["", "worker 1 did not start in 60s"])
def test_a_slot_down_too_long_is_wedged_with_the_reason(error: str) -> None:
    outages = Outages(2)
    now = 1000.0
    outages.worker_died(1, quick=False, now=now - WEDGED_AFTER + 1)
    assert outages.wedged(now, template_running=True) is None  # not yet
    outages.worker_failed(1, error)
    reason = outages.wedged(now + 2, template_running=True)
    expected = "worker 1 could not be started for 61s" + (f": {error}" if error else "")
    assert reason == expected
    outages.template_gone(now - WEDGED_AFTER - 10)
    reason = outages.wedged(now + 2, template_running=False)
    assert reason == (f"the worker template process could not be restarted for 72s; {expected}")
    outages.worker_up(1)
    assert outages.wedged(now + 2, template_running=False) == (
        "the worker template process could not be restarted for 72s"
    )
