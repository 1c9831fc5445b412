"""Stalled workers and standby workers (``engine/pool/stalls.py``) over fake workers with
real request rings, a real dispatcher and a fake supervisor: which workers count as
stalled, where their queued requests go, when a standby worker starts and retires."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.messages import Kind, request_header
from inferpool.engine.ipc.ring import RUNNING_IDS, Ring, create_ring_fd
from inferpool.engine.pool import stalls as stalls_module
from inferpool.engine.pool.dispatch import Dispatcher, Route
from inferpool.engine.pool.stalls import Stalls
from inferpool.engine.states import ModelTable
from inferpool.errors import InferpoolError
from inferpool.settings import ModelSettings, ServerSettings

THRESHOLD = 0.5  # seconds


class Worker:
    """What the stall tracking uses of a ``WorkerHandle``, with a real request ring."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.alive = True
        self.closed = False
        self.retiring = False
        self.standby = False
        self.inflight: dict[int, Any] = {}
        self.requests = Ring(create_ring_fd(8, 512), 8, 512)
        self.request_bell = os.eventfd(0)
        self.sent: list[messages.Control] = []

    def describe(self) -> str:
        return f"worker {self.slot}"

    def post_control(self, message: messages.Control) -> None:
        self.sent.append(message)

    def queue(self, request_id: int, model_index: int) -> asyncio.Future[Any]:
        """A request sent to it and not answered: in its ring and its in-flight map."""
        body = b"body %d" % request_id
        header = request_header(request_id, model_index, Kind.REST, None, None, len(body))
        assert self.requests.push(header, body)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.inflight[request_id] = future
        return future

    def runs(self, model_index: int, request_ids: list[int], seconds_ago: float) -> None:
        started = time.monotonic_ns() - int(seconds_ago * 1e9)
        self.requests.mark_running(model_index, request_ids, started)

    def cancelled(self) -> list[int]:
        return [m.request_id for m in self.sent if isinstance(m, messages.Cancel)]


class Roster:
    def eligible_slots(self, settings: ModelSettings) -> set[int]:
        return {0, 1, 2}


class Supervisor:
    """What the stall tracking asks of the supervisor: its workers, and standby ones."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self.standby: set[Worker] = set()
        self.spares: set[Worker] = set()
        self.roster = Roster()
        self.tasks: list[asyncio.Task[Any]] = []
        self.spawned: list[int] = []
        self.retired: list[Worker] = []
        self.spawn_error: InferpoolError | None = None

    def stopping(self) -> bool:
        return False

    def alive(self) -> list[Worker]:
        return [worker for worker in self.workers if worker.alive]

    def keep(self, work: Coroutine[Any, Any, Any]) -> None:
        self.tasks.append(asyncio.ensure_future(work))

    async def spawn(self, slot: int) -> Worker:
        self.spawned.append(slot)
        if self.spawn_error is not None:
            raise self.spawn_error
        worker = Worker(10 + slot)
        self.spares.add(worker)
        return worker

    def retire(self, worker: Worker) -> None:
        self.retired.append(worker)


class Placement:
    def __init__(self) -> None:
        self.loads: list[tuple[int, str]] = []

    async def load_on(self, worker: Worker, route: Route) -> messages.Loaded:
        self.loads.append((worker.slot, route.name))
        return messages.Loaded(index=route.index, ok=True)


class Pool:
    """Models ``a`` (index 1) and ``b`` (index 2), each with a replica on each worker."""

    def __init__(self, workers: int = 2, max_standby: int = 1) -> None:
        self.workers = [Worker(slot) for slot in range(workers)]
        self.supervisor = Supervisor(self.workers)
        self.dispatcher = Dispatcher(ModelTable(), 8, workers, lambda: False)
        self.a = Route(ModelSettings(name="a"), 1, 0)
        self.b = Route(ModelSettings(name="b"), 2, 0)
        for route in (self.a, self.b):
            route.ready.extend(self.workers)
            self.dispatcher.publish(route)
        settings = ServerSettings(stall_threshold=THRESHOLD, max_standby_workers=max_standby)
        self.placement = Placement()
        self.stalls = Stalls(settings, self.supervisor, self.dispatcher, self.placement)  # type: ignore[arg-type]

    async def settle(self) -> None:
        """Let the standby worker's start (a kept task) finish."""
        await asyncio.gather(*self.supervisor.tasks)
        self.supervisor.tasks.clear()


def test_no_threshold_no_tracking() -> None:
    async def main() -> None:
        pool = Pool()
        pool.stalls.threshold_ns = 0
        pool.workers[0].runs(1, [5], seconds_ago=60)
        pool.stalls.tick(time.monotonic())
        assert pool.stalls.stalled == {} and pool.a.ready == pool.workers

    asyncio.run(main())


def test_a_long_call_takes_its_worker_out_of_every_route_until_it_ends() -> None:
    async def main() -> None:
        pool = Pool()
        first, second = pool.workers
        first.runs(1, [5], seconds_ago=THRESHOLD * 4)
        second.runs(2, [6], seconds_ago=THRESHOLD / 10)  # running, not long yet
        pool.stalls.tick(time.monotonic())
        assert list(pool.stalls.stalled) == [first] and pool.stalls.stalls == 1
        assert pool.a.ready == [second] and pool.a.stalled == [first]
        assert pool.b.ready == [second] and pool.b.stalled == [first]
        pool.stalls.tick(time.monotonic())  # still the same call: counted once
        assert pool.stalls.stalls == 1
        first.requests.mark_idle()
        pool.stalls.tick(time.monotonic())
        assert pool.stalls.stalled == {} and pool.a.stalled == pool.b.stalled == []
        assert set(pool.a.ready) == set(pool.b.ready) == {first, second}

    asyncio.run(main())


def test_a_stalled_worker_that_dies_does_not_come_back() -> None:
    async def main() -> None:
        pool = Pool()
        first, second = pool.workers
        first.runs(1, [5], seconds_ago=THRESHOLD * 4)
        pool.stalls.tick(time.monotonic())
        first.alive = False
        first.closed = True
        pool.stalls.tick(time.monotonic())
        assert pool.stalls.stalled == {} and pool.a.ready == [second] and pool.a.stalled == []

    asyncio.run(main())


def test_requests_queued_behind_a_long_call_move_to_a_ready_replica() -> None:
    async def main() -> None:
        pool = Pool()
        first, second = pool.workers
        started = first.queue(5, 1)  # the long call itself
        other = first.queue(6, 2)  # model b, queued behind it
        own = first.queue(7, 1)  # model a, queued behind its own long call
        first.runs(1, [5], seconds_ago=THRESHOLD * 4)
        pool.stalls.tick(time.monotonic())
        # The record names the whole group: a's own queued request moves too.
        assert set(second.inflight) == {6, 7} and set(first.inflight) == {5}
        assert second.inflight[6] is other and second.inflight[7] is own
        assert first.inflight[5] is started
        assert sorted(first.cancelled()) == [6, 7] and pool.stalls.moved == 2
        moved = {fields[0]: body for fields, body in second.requests.pop_all()}
        assert moved == {6: b"body 6", 7: b"body 7"}

    asyncio.run(main())


def test_the_stalling_model_s_requests_stay_when_the_record_does_not_name_its_group() -> None:
    async def main() -> None:
        pool = Pool()
        first, second = pool.workers
        group = list(range(100, 101 + RUNNING_IDS))  # more than the record holds
        first.queue(7, 1)
        first.queue(8, 2)
        first.runs(1, group, seconds_ago=THRESHOLD * 4)
        pool.stalls.tick(time.monotonic())
        assert set(second.inflight) == {8} and set(first.inflight) == {7}

    asyncio.run(main())


def test_a_model_with_only_stalled_replicas_gets_a_standby_worker() -> None:
    async def main() -> None:
        pool = Pool()
        first, second = pool.workers
        first.runs(1, [5], seconds_ago=THRESHOLD * 4)
        second.runs(1, [6], seconds_ago=THRESHOLD * 4)  # a hangs on both workers
        pool.stalls.tick(time.monotonic())
        assert pool.b.ready == [] and pool.b.standby_coming
        assert not pool.a.standby_coming  # the stalling model gets none
        await pool.settle()
        standby = pool.b.ready[0]
        assert pool.supervisor.spawned == [0] and standby in pool.supervisor.standby
        assert standby.standby and standby not in pool.supervisor.spares
        assert pool.placement.loads == [(standby.slot, "b")] and pool.a.ready == []
        assert not pool.b.standby_coming and pool.stalls.standby_started == 1
        pool.stalls.tick(time.monotonic())
        assert pool.supervisor.spawned == [0]  # b has a ready replica now

    asyncio.run(main())


def test_past_the_bound_no_standby_worker_starts(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        pool = Pool(max_standby=0)
        for worker in pool.workers:
            worker.runs(1, [5], seconds_ago=THRESHOLD * 4)
        pool.stalls.tick(time.monotonic())
        pool.stalls.tick(time.monotonic())
        assert pool.supervisor.spawned == [] and not pool.b.standby_coming

    asyncio.run(main())
    told = [r for r in caplog.records if "--max-standby-workers" in r.getMessage()]
    assert len(told) == 1  # said once, not at every tick


def test_a_standby_worker_that_cannot_start_is_tried_again_later() -> None:
    async def main() -> None:
        pool = Pool()
        pool.supervisor.spawn_error = InferpoolError("no memory")
        for worker in pool.workers:
            worker.runs(1, [5], seconds_ago=THRESHOLD * 4)
        now = time.monotonic()
        pool.stalls.tick(now)
        await pool.settle()
        assert not pool.b.standby_coming and pool.supervisor.standby == set()
        pool.stalls.tick(time.monotonic())  # too soon
        assert pool.supervisor.spawned == [0]
        pool.stalls.tick(time.monotonic() + stalls_module.RETRY_AFTER + 1)
        await pool.settle()
        assert pool.supervisor.spawned == [0, 0]

    asyncio.run(main())


def test_standby_workers_retire_once_calm_and_replaced() -> None:
    async def main() -> None:
        pool = Pool()
        for worker in pool.workers:
            worker.runs(1, [5], seconds_ago=THRESHOLD * 4)
        pool.stalls.tick(time.monotonic())
        await pool.settle()
        standby = pool.b.ready[0]
        pool.workers[0].requests.mark_idle()  # one stall ends; the other's worker is gone
        pool.workers[1].alive = False
        pool.workers[1].closed = True
        now = time.monotonic()
        pool.stalls.tick(now)
        assert pool.stalls.stalled == {} and standby in pool.b.ready
        pool.stalls.tick(now + stalls_module.STANDBY_LINGER + 1)
        assert pool.supervisor.retired == [standby] and standby not in pool.b.ready
        assert pool.supervisor.standby == set()

    asyncio.run(main())


def test_a_standby_worker_that_is_a_model_s_only_replica_stays() -> None:
    async def main() -> None:
        pool = Pool(workers=1)
        pool.workers[0].runs(1, [5], seconds_ago=THRESHOLD * 4)
        pool.stalls.tick(time.monotonic())
        await pool.settle()
        standby = pool.b.ready[0]
        pool.workers[0].alive = False  # its worker died: the slot's replacement has no b yet
        pool.workers[0].closed = True
        now = time.monotonic()
        pool.stalls.tick(now)
        pool.stalls.tick(now + stalls_module.STANDBY_LINGER + 1)
        assert pool.supervisor.retired == [] and pool.b.ready == [standby]

    asyncio.run(main())
