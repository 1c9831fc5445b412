"""Blaming a crash on its model (``engine/pool/crash_blame.py``) without a template process:
a crash counted at once when the exit status is in, later when it comes, not at all when
it never does or the model is gone meanwhile; and an orphaned worker reaped only when it is
this process's child."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Coroutine
from typing import Any

import pytest

from inferpool.engine.pool import crash_blame, crashes
from inferpool.engine.pool.crash_blame import CrashBlame

SEGV = signal.SIGSEGV  # the waitpid status of a process killed by SIGSEGV


class Worker:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def describe(self) -> str:
        return f"worker 0 (pid {self.pid})"


class Template:
    """The worker's template: reading its channel reports nothing here."""

    def __init__(self) -> None:
        self.reads = 0

    def receive(self) -> None:
        self.reads += 1


class Models:
    def __init__(self) -> None:
        self.served = {1: "m"}
        self.quarantined: list[tuple[int, str]] = []

    def model_name(self, index: int) -> str | None:
        return self.served.get(index)

    def quarantine(self, index: int, reason: str) -> None:
        self.quarantined.append((index, reason))


@pytest.fixture(autouse=True)
def quick(monkeypatch) -> None:
    monkeypatch.setattr(crashes, "oom_kills", lambda: 0)
    monkeypatch.setattr(crash_blame, "EXIT_STATUS_WAIT", 0.2)


def make() -> tuple[CrashBlame, Models, Template, list[Coroutine[Any, Any, Any]]]:
    models, template = Models(), Template()
    later: list[Coroutine[Any, Any, Any]] = []
    return CrashBlame(models, later.append, lambda worker: template), models, template, later


def test_three_crashes_with_their_statuses_in_quarantine_the_model() -> None:
    blame, models, template, later = make()
    for pid in (101, 102, 103):
        blame.exits.reported(pid, SEGV)
        blame.blame(Worker(pid), 1, [pid])  # type: ignore[arg-type]
    assert later == [] and template.reads == 3
    [(index, reason)] = models.quarantined
    assert index == 1 and "crashed workers 3 times" in reason and "SIGSEGV" in reason
    blame.blame(Worker(104), 2, [1])  # type: ignore[arg-type]  # no such model: not counted
    assert later == []


def test_a_status_that_comes_later_is_counted_then(caplog) -> None:
    blame, models, _, later = make()

    async def run() -> None:
        for pid in (201, 202, 203):
            blame.blame(Worker(pid), 1, [pid])  # type: ignore[arg-type]
        assert len(later) == 3
        waiting = [asyncio.ensure_future(work) for work in later]
        await asyncio.sleep(0)
        for pid in (201, 202):
            blame.exits.reported(pid, SEGV)
        models.served.pop(1)  # unloaded before the third's status came: not counted
        blame.exits.reported(203, SEGV)
        await asyncio.gather(*waiting)

    asyncio.run(run())
    assert models.quarantined == []  # two counted, the third's model was gone
    assert blame.crashes.count("w", "m", [9], SEGV, 10**9) is None  # history kept: 2 + 1

    blame, models, _, later = make()
    with caplog.at_level(logging.WARNING):
        blame.blame(Worker(301), 1, [1])  # type: ignore[arg-type]
        asyncio.run(later[0])  # no status within EXIT_STATUS_WAIT
    assert "no exit status for worker 0 (pid 301); its crash is not counted" in caplog.text


def test_exit_status_waits_for_the_report() -> None:
    blame, _, _, _ = make()

    async def run() -> tuple[int | None, int | None]:
        blame.exits.reported(401, 0)
        now = await blame.exit_status(Worker(401))  # type: ignore[arg-type]
        asyncio.get_running_loop().call_later(0.05, blame.exits.reported, 402, SEGV)
        return now, await blame.exit_status(Worker(402))  # type: ignore[arg-type]

    assert asyncio.run(run()) == (0, SEGV)


def test_an_orphan_is_reaped_only_if_it_is_our_child() -> None:
    blame, _, _, _ = make()
    # A child no Popen object holds (as a worker whose template died: it reaps nothing).
    pid = os.posix_spawnp("sh", ["sh", "-c", "exit 3"], os.environ)
    asyncio.run(blame.reap_orphan(pid))
    assert blame.exits.take(pid) == 3 << 8  # reaped here, its status reported
    asyncio.run(blame.reap_orphan(1))  # init is nobody's child: nothing to reap
    assert blame.exits.take(1) is None
