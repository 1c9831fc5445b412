"""The supervisor's decisions about workers, without processes (``engine/pool/supervisor.py``):
a dead worker in its slot reported, blamed and replaced, one that never started or died
during shutdown not; a retiring or spare worker's exit not replaced; a new generation
taking a slot over and the old worker retired (killed if it does not exit); replacement
backing off through failed starts and giving up to a new generation; a group whose
worker does not start; and the drain at shutdown."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from inferpool.engine.ipc import messages
from inferpool.engine.pool import supervisor as supervisor_module
from inferpool.engine.pool.supervisor import Superseded, Supervisor
from inferpool.errors import WorkerLost
from inferpool.settings import ServerSettings


class Hello:
    def __init__(self, done: bool) -> None:
        self._done = done

    def done(self) -> bool:
        return self._done


class Requests:
    def __init__(self, running: tuple[int, list[int], int] | None) -> None:
        self._running = running

    def running(self) -> tuple[int, list[int], int] | None:
        return self._running


class Worker:
    """What the supervisor uses of a WorkerHandle."""

    def __init__(
        self,
        slot: int,
        running: tuple[int, list[int], int] | None = None,
        started: bool = True,
        age: float = 100.0,
    ) -> None:
        self.slot = slot
        self.pid = 0  # nothing to signal or reap
        self.alive = True
        self.closed = False
        self.retiring = False
        self.standby = False
        self.template: Any = None  # the keeper's template (none started here)
        self.hello = Hello(started)
        self.requests = Requests(running)
        self.inflight: dict[int, Any] = {}
        self.started_at = time.monotonic() - age
        self.sent: list[Any] = []
        self.closed_with = ""
        self.exited: asyncio.Future[None] | None = None

    def drain_replies(self) -> None:
        pass

    def close(self, reason: str) -> None:
        self.alive = False
        self.closed = True
        self.closed_with = reason

    def describe(self) -> str:
        return f"worker {self.slot} (pid {self.pid})"

    def post_control(self, message: Any) -> None:
        self.sent.append(message)


class Pool:
    """The PoolEvents side, recording what it was told."""

    started = True

    def __init__(self) -> None:
        self.lost: list[Worker] = []
        self.replaced: list[Worker] = []

    def timeout_of(self, model_index: int) -> float:
        return 0.0

    def model_name(self, model_index: int) -> str | None:
        return "m"

    def worker_lost(self, worker: Worker) -> None:
        self.lost.append(worker)

    async def worker_replaced(self, worker: Worker) -> None:
        self.replaced.append(worker)

    def serve_call(self, worker: Worker, message: object, answer: object) -> None:
        raise AssertionError("no call to another model here")

    def shared_documents(self) -> list[dict[str, Any]]:
        return []

    def quarantine(self, model_index: int, reason: str) -> None:
        raise AssertionError("no quarantine here")

    def tick(self, now: float) -> None:
        pass


def make(stopping: bool = False) -> tuple[Supervisor, Pool, list[str], list[tuple]]:
    """A supervisor of two slots whose background work is recorded, not run, and whose
    crash blame is recorded."""
    pool = Pool()
    chief = Supervisor(ServerSettings(workers=2), pool, lambda: stopping)  # type: ignore[arg-type]
    kept: list[str] = []

    def keep(work: Coroutine[Any, Any, Any]) -> None:
        kept.append(work.__qualname__)
        work.close()

    blamed: list[tuple] = []
    chief.keep = keep  # type: ignore[method-assign]
    chief.blame.blame = lambda worker, index, ids: blamed.append((worker, index, ids))  # type: ignore[method-assign]
    return chief, pool, kept, blamed


# -- a worker dies -------------------------------------------------------------------------
def test_a_crashed_worker_is_reported_blamed_and_replaced() -> None:
    chief, pool, kept, blamed = make()
    worker = Worker(0, running=(3, [7, 8], 0))
    chief.workers[0] = worker  # type: ignore[assignment]
    chief.worker_died(worker, "killed by signal 9")  # type: ignore[arg-type]
    assert worker.closed_with == "killed by signal 9"
    assert pool.lost == [worker]
    assert blamed == [(worker, 3, [7, 8])]
    assert kept == ["Supervisor._replace"]
    # A running request to blame: not a quick death, so no back-off for the slot.
    assert chief.outages.quick_deaths[0] == 0 and chief.outages.down_since[0] is not None
    # Its EOF after the kill changes nothing.
    chief.worker_died(worker, "again")  # type: ignore[arg-type]
    assert pool.lost == [worker] and kept == ["Supervisor._replace"]


def test_a_worker_dying_soon_after_start_with_nothing_to_blame_backs_the_slot_off() -> None:
    chief, _, kept, blamed = make()
    worker = Worker(1, age=0.1)
    chief.workers[1] = worker  # type: ignore[assignment]
    chief.worker_died(worker)  # type: ignore[arg-type]
    assert worker.closed_with == "worker 1 (pid 0) exited"
    assert blamed == [] and kept == ["Supervisor._replace"]
    assert chief.outages.quick_deaths[1] == 1
    # Killed for the watchdog (crash=False): neither blamed nor a quick death.
    again = Worker(1, running=(3, [1], 0), age=0.1)
    chief.workers[1] = again  # type: ignore[assignment]
    chief.worker_died(again, "recycled", crash=False)  # type: ignore[arg-type]
    assert blamed == [] and chief.outages.quick_deaths[1] == 0


def test_a_worker_that_never_started_or_dies_at_shutdown_is_not_replaced() -> None:
    chief, pool, kept, _ = make()
    starting = Worker(0, started=False)
    chief.workers[0] = starting  # type: ignore[assignment]
    chief.worker_died(starting, "template gone")  # type: ignore[arg-type]
    assert starting.closed and pool.lost == [] and kept == []  # its _spawn fails, retried

    chief, pool, kept, _ = make(stopping=True)
    worker = Worker(0)
    chief.workers[0] = worker  # type: ignore[assignment]
    chief.worker_died(worker)  # type: ignore[arg-type]
    assert worker.closed and pool.lost == [] and kept == []


def test_an_orphan_whose_template_died_first_is_reaped() -> None:
    chief, _, kept, _ = make()
    worker = Worker(0)
    worker.template = object()  # a template that is not the keeper's now
    chief.workers[0] = worker  # type: ignore[assignment]
    chief.worker_died(worker)  # type: ignore[arg-type]
    assert kept == ["CrashBlame.reap_orphan", "Supervisor._replace"]


def test_workers_without_a_slot_exit_without_replacement(caplog) -> None:
    chief, pool, kept, blamed = make()
    caplog.set_level(logging.INFO, logger=supervisor_module.__name__)
    drained, unanswered, spare, standby = Worker(0), Worker(0), Worker(1), Worker(1)
    drained.retiring = unanswered.retiring = True
    unanswered.inflight = {1: None, 2: None}
    standby.standby = True
    chief.retiring |= {drained, unanswered}  # type: ignore[arg-type]
    chief.spares.add(spare)  # type: ignore[arg-type]
    chief.standby.add(standby)  # type: ignore[arg-type]
    for worker in (drained, unanswered, spare, standby):
        chief.worker_died(worker)  # type: ignore[arg-type]
    assert not (chief.retiring or chief.spares or chief.standby)
    assert pool.lost == [drained, unanswered, spare, standby]  # their replicas stop
    assert kept == [] and blamed == [] and chief.worker_restarts == 0
    text = caplog.text
    assert "worker 0 (pid 0) has drained and exited" in text
    assert "worker 0 (pid 0) exited with 2 request(s) unanswered" in text
    assert "worker 1 (pid 0) of a new generation exited" in text
    assert "worker 1 (pid 0) exited" in text
    # A spare closed because its generation did not take over (crash=False): no warning.
    caplog.clear()
    quiet = Worker(1)
    chief.worker_died(quiet, "not taken over", crash=False)  # type: ignore[arg-type]
    assert "exited" not in caplog.text


def test_a_retiring_worker_that_crashed_mid_request_is_blamed() -> None:
    chief, _, kept, blamed = make()
    worker = Worker(0, running=(4, [9], 0))
    worker.retiring = True
    worker.template = object()
    chief.worker_died(worker)  # type: ignore[arg-type]
    assert blamed == [(worker, 4, [9])]
    assert kept == ["CrashBlame.reap_orphan"]


# -- a new generation takes over -------------------------------------------------------------
def test_a_new_generation_takes_the_slot_and_the_old_worker_retires() -> None:
    chief, _, kept, _ = make()
    old, new = Worker(0), Worker(0)
    chief.workers[0] = old  # type: ignore[assignment]
    chief.spares.add(new)  # type: ignore[arg-type]
    assert chief.take_over(0, new) is old  # type: ignore[arg-type]
    assert chief.workers[0] is new and not chief.spares
    assert chief.rolls_by_slot == [1, 0]
    assert old.retiring and old in chief.retiring
    assert [type(m) for m in old.sent] == [messages.Stop]
    assert kept == ["Supervisor._kill_unless_exited"]
    # An empty slot: nothing to retire.
    assert chief.take_over(1, Worker(1)) is None  # type: ignore[arg-type]
    # A worker already gone is marked retiring, and nothing more.
    gone = Worker(0)
    gone.alive = False
    chief.retire(gone)  # type: ignore[arg-type]
    assert gone.retiring and gone not in chief.retiring and gone.sent == []


def test_a_retired_worker_is_killed_only_if_it_does_not_exit() -> None:
    chief, _, _, _ = make()
    killed: list[tuple[str, bool]] = []
    chief.kill = lambda worker, reason, crash: killed.append((reason, crash))  # type: ignore[method-assign]

    async def run() -> None:
        loop = asyncio.get_running_loop()
        exits, hangs = Worker(0), Worker(1)
        exits.exited = loop.create_future()
        hangs.exited = loop.create_future()
        loop.call_later(0.05, exits.exited.set_result, None)
        await chief._kill_unless_exited(exits, 0)  # type: ignore[arg-type]
        assert killed == []
        await chief._kill_unless_exited(hangs, 0)  # type: ignore[arg-type]  # waits 0.5 s

    asyncio.run(run())
    assert killed == [("worker 1 (pid 0) did not exit after it was replaced", False)]


# -- replacement -----------------------------------------------------------------------------
def test_a_replacement_retries_failed_starts_then_counts_the_restart(monkeypatch) -> None:
    chief, pool, _, _ = make()
    monkeypatch.setattr(chief.outages, "worker_delay", lambda slot, attempt: 0.0)
    errors: list[str] = []
    failed_with = chief.outages.worker_failed
    monkeypatch.setattr(
        chief.outages, "worker_failed", lambda slot, e: (errors.append(e), failed_with(slot, e))
    )
    worker = Worker(1)
    starts = [WorkerLost("cannot start worker 1: fork failed"), WorkerLost("did not start"), worker]

    async def spawn(slot: int, installs: int | None) -> Worker:
        assert (slot, installs) == (1, 0)
        result = starts.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    monkeypatch.setattr(chief, "_spawn", spawn)
    chief.outages.worker_died(1, False, time.monotonic())
    asyncio.run(chief._replace(1))
    assert errors == ["cannot start worker 1: fork failed", "did not start"]
    assert chief.worker_restarts == 1 and chief.restarts_by_slot == [0, 1]
    assert pool.replaced == [worker]  # its models are loaded again
    assert chief.outages.down_since[1] is None and chief.outages.start_errors[1] == ""


def test_a_replacement_gives_up_to_a_new_generation(monkeypatch) -> None:
    chief, pool, _, _ = make()
    monkeypatch.setattr(chief.outages, "worker_delay", lambda slot, attempt: 0.0)

    async def superseded(slot: int, installs: int | None) -> Worker:
        raise Superseded("worker 0 was replaced by a new generation")

    monkeypatch.setattr(chief, "_spawn", superseded)
    asyncio.run(chief._replace(0))
    assert chief.worker_restarts == 0 and pool.replaced == []

    # Started, but a new generation took the slot meanwhile: counted, its models not loaded.
    retired = Worker(0)
    retired.retiring = True

    async def started(slot: int, installs: int | None) -> Worker:
        return retired

    monkeypatch.setattr(chief, "_spawn", started)
    asyncio.run(chief._replace(0))
    assert chief.worker_restarts == 1 and pool.replaced == []


def test_no_replacement_once_the_server_stops() -> None:
    chief, pool, _, _ = make(stopping=True)
    asyncio.run(chief._replace(0))
    assert chief.worker_restarts == 0 and pool.replaced == []


@pytest.mark.parametrize("installs", [1, 5])
def test_a_start_for_an_outdated_roll_is_superseded(installs: int) -> None:
    chief, _, _, _ = make()

    class Keeper:
        async def running(self) -> object:
            return object()

    chief.templates.running = Keeper().running  # type: ignore[method-assign]
    with pytest.raises(Superseded, match="worker 0 was replaced by a new generation"):
        asyncio.run(chief._spawn(0, installs))
    assert chief.workers[0] is None


def test_a_group_whose_worker_does_not_start_logs_it_and_retries(monkeypatch, caplog) -> None:
    chief, _, kept, _ = make()
    group = chief.group_of(0)

    async def spawn(slot: int, installs: int | None) -> Worker:
        if slot == 1:
            raise WorkerLost("worker 1 did not start in 60s")
        return Worker(slot)

    monkeypatch.setattr(chief, "_spawn", spawn)
    asyncio.run(chief.fill(group))
    assert f"{group.name}: worker 1 did not start: worker 1 did not start in 60s" in caplog.text
    assert kept == ["Supervisor._replace"]  # slot 1 only
    assert chief.outages.down_since[1] is not None and chief.outages.down_since[0] is None


# -- starting a worker -----------------------------------------------------------------------
class Starting(Worker):
    """A WorkerHandle being started: ``how`` decides its template's answer (``ok``: hello,
    ``refused``: the template's channel is closed, ``exits``: it dies before its hello,
    ``silent``: no hello ever)."""

    how = "ok"
    made: list[Starting] = []

    def __init__(self, slot: int, max_queue: int) -> None:
        super().__init__(slot)
        self.hello = asyncio.get_running_loop().create_future()  # type: ignore[assignment]
        self.pid = 700 + slot
        Starting.made.append(self)

    def ask_template(self, channel: Any, threads: int, limits: Any, memory: int) -> None:
        if self.how == "refused":
            raise OSError("channel closed")
        if self.how == "ok":
            self.hello.set_result(None)  # type: ignore[attr-defined]
        elif self.how == "exits":
            self.hello.set_exception(WorkerLost("it exited"))  # type: ignore[attr-defined]

    def watch(self, on_exit: Any) -> None:
        self.on_exit = on_exit


def spawning(monkeypatch, how: str) -> tuple[Any, SimpleNamespace]:
    """A supervisor whose workers are ``Starting`` handles that start as ``how`` says,
    forked from a running template; the supervisor and the template."""
    chief, _, _, _ = make()
    template = SimpleNamespace(channel=None)

    async def running() -> object:
        return template

    monkeypatch.setattr(chief.templates, "running", running)
    monkeypatch.setattr(supervisor_module, "WorkerHandle", Starting)
    monkeypatch.setattr(Starting, "how", how)
    return chief, template


@pytest.mark.parametrize(
    ("how", "error"),
    [
        ("refused", "cannot start worker 0: channel closed"),
        ("exits", "worker 0 exited while starting"),
        ("silent", "worker 0 did not start in 0s"),
    ],
)
def test_a_worker_that_does_not_start_is_worker_lost(monkeypatch, how: str, error: str) -> None:
    chief, _ = spawning(monkeypatch, how)
    monkeypatch.setattr(supervisor_module, "SPAWN_TIMEOUT", 0.05)
    Starting.made.clear()
    with pytest.raises(WorkerLost) as caught:
        asyncio.run(chief._spawn(0, 0))
    assert caught.value.message == error
    assert not chief._starting
    if how != "exits":  # a worker that exited was closed by its own EOF
        assert Starting.made[0].closed


def test_a_started_worker_takes_its_slot_or_waits_as_a_spare(monkeypatch) -> None:
    chief, template = spawning(monkeypatch, "ok")
    worker = asyncio.run(chief._spawn(1, 0))
    assert chief.workers[1] is worker and worker.template is template
    assert worker.on_exit == chief.worker_died  # type: ignore[attr-defined]
    spare = asyncio.run(chief.spawn(0))
    assert chief.workers[0] is None and spare in chief.spares


def test_workers_a_dead_template_never_forked_fail_their_start() -> None:
    chief, _, _, _ = make()
    died: list[str] = []
    chief.worker_died = lambda worker, reason="", crash=True: died.append(reason)  # type: ignore[method-assign]
    chief._starting.add(Worker(0))  # type: ignore[arg-type]
    chief._template_gone(chief.templates)
    assert died == ["the worker template process exited"]
    chief._template_gone(object())  # type: ignore[arg-type]  # another group's template
    assert died == ["the worker template process exited"]
