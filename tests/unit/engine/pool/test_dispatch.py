"""Dispatch without processes: fake worker handles stand in for the workers.

The least-loaded replica takes a request (an idle first replica; under load ties go
round-robin), a full pool answers Overloaded, a model whose replicas are being replaced
makes its requests wait for one (bounded), then NotReady; a caller that goes away cancels
its request in the worker.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.messages import Kind, Reply, RequestHeader
from inferpool.engine.pool.dispatch import REPLICA_WAIT, Dispatcher, Route
from inferpool.engine.states import ModelState, ModelStatus, ModelTable
from inferpool.errors import NotReady, Overloaded
from inferpool.settings import ModelSettings


class FakeRing:
    def __init__(self) -> None:
        self.pushed: list[RequestHeader] = []

    def push(self, header: bytes, body: bytes) -> bool:
        self.pushed.append(RequestHeader.unpack_from(header))
        return True

    def needs_bell(self) -> bool:
        return True


class FakeWorker:
    """What dispatch uses of a WorkerHandle."""

    def __init__(self, slot: int, busy: int = 0) -> None:
        self.slot = slot
        self.alive = True
        self.inflight: dict[int, Any] = {-i: None for i in range(1, busy + 1)}
        self.models: dict[str, tuple[int, int]] = {}
        self.requests = FakeRing()
        self.request_bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.controls: list[messages.Control] = []

    def post_control(self, message: messages.Control) -> None:
        self.controls.append(message)

    def describe(self) -> str:
        return f"worker {self.slot} (pid 0)"

    def close(self) -> None:
        os.close(self.request_bell)


def make(
    workers: list[FakeWorker], max_queue: int = 4, stopping: bool = False
) -> tuple[Dispatcher, Route]:
    table = ModelTable()
    table.set(ModelStatus("m", None, ModelState.READY))
    dispatcher = Dispatcher(table, max_queue, max(1, len(workers)), lambda: stopping)
    route = Route(ModelSettings(name="m"), 7, 0.0)
    route.ready = list(workers)  # type: ignore[arg-type]
    for worker in workers:
        worker.models["m"] = (7, 0)
    dispatcher.publish(route)
    return dispatcher, route


async def answer_when_pushed(worker: FakeWorker, body: bytes) -> None:
    """Wait (bounded) for the one request pushed to ``worker``, and answer it 200."""
    for _ in range(100):
        if worker.requests.pushed:
            break
        await asyncio.sleep(0.01)
    [header] = worker.requests.pushed
    worker.inflight.pop(header.request_id).set_result(Reply(200, body))


def test_the_least_loaded_replica_is_picked() -> None:
    workers = [FakeWorker(0, busy=3), FakeWorker(1, busy=1), FakeWorker(2, busy=2)]
    dispatcher, route = make(workers)
    for _ in range(3):  # whatever the round-robin turn
        assert dispatcher.pick(route) is workers[1]


def test_an_idle_first_replica_takes_the_request() -> None:
    # One request at a time keeps going to the same (warm) worker, not to each in turn.
    workers = [FakeWorker(0), FakeWorker(1), FakeWorker(2)]
    dispatcher, route = make(workers)
    assert [dispatcher.pick(route) for _ in range(4)] == [workers[0]] * 4


def test_under_load_ties_go_round_robin() -> None:
    workers = [FakeWorker(0, busy=1), FakeWorker(1, busy=1), FakeWorker(2, busy=1)]
    dispatcher, route = make(workers)
    picked = [dispatcher.pick(route) for _ in range(6)]
    assert {id(w) for w in picked[:3]} == {id(w) for w in workers}
    assert picked[:3] == picked[3:]
    workers[2].inflight.clear()  # an idle replica that is not the first: the least loaded
    assert [dispatcher.pick(route) for _ in range(3)] == [workers[2]] * 3


def test_a_full_queue_is_skipped_and_every_queue_full_is_overloaded() -> None:
    workers = [FakeWorker(0, busy=2), FakeWorker(1, busy=2)]
    dispatcher, route = make(workers, max_queue=2)
    assert dispatcher.pick(route) is None

    async def infer() -> Reply:
        return await dispatcher.infer("m", Kind.REST, b"{}", None, None)

    with pytest.raises(Overloaded, match="every replica's queue is full"):
        asyncio.run(infer())
    del workers[1].inflight[-1]
    assert dispatcher.pick(route) is workers[1]


def test_a_request_goes_to_the_ring_and_comes_back() -> None:
    worker = FakeWorker(0)
    dispatcher, _ = make([worker])

    async def run() -> Reply:
        call = asyncio.ensure_future(dispatcher.infer("m", Kind.GRPC, b"body", None, None))
        await asyncio.sleep(0)
        [header] = worker.requests.pushed
        assert (header.model_index, header.kind, header.length) == (7, Kind.GRPC, 4)
        assert os.eventfd_read(worker.request_bell) == 1  # the doorbell rang
        worker.inflight.pop(header.request_id).set_result(Reply(200, b"ok"))
        return await call

    assert asyncio.run(run()).body == b"ok"
    assert not worker.inflight


def test_a_caller_gone_cancels_its_request_in_the_worker() -> None:
    worker = FakeWorker(0)
    dispatcher, _ = make([worker])

    async def run() -> None:
        call = asyncio.ensure_future(dispatcher.infer("m", Kind.REST, b"{}", None, None))
        await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(run())
    [header] = worker.requests.pushed
    assert worker.controls == [messages.Cancel(request_id=header.request_id)]


def test_a_request_waits_for_a_replica_then_is_not_ready() -> None:
    dispatcher, route = make([])
    route.empty_since = time.monotonic()

    async def run() -> None:
        started = time.monotonic()
        deadline = started + 0.2
        with pytest.raises(NotReady, match="its workers are restarting"):
            await dispatcher.infer("m", Kind.REST, b"{}", None, deadline)
        assert 0.15 < time.monotonic() - started < 1.0  # it waited, bounded by its deadline

    asyncio.run(run())
    assert route.waiting == 0


def test_a_waiting_request_takes_the_replica_that_comes_back() -> None:
    worker = FakeWorker(0)
    dispatcher, route = make([])

    assert asyncio.run(takes_the_replica_back(dispatcher, route, worker)).body == b"back"


async def takes_the_replica_back(dispatcher: Dispatcher, route: Route, worker: FakeWorker) -> Reply:
    """A request that waits for a replica, given ``worker`` as one: its answer there."""
    call = asyncio.ensure_future(dispatcher.infer("m", Kind.REST, b"{}", None, None))
    await asyncio.sleep(0.05)
    assert route.waiting == 1 and not worker.requests.pushed
    assert dispatcher.replica_ready(route, worker)  # type: ignore[arg-type]
    await answer_when_pushed(worker, b"back")
    return await call


def test_a_model_quarantined_while_waiting_says_so() -> None:
    dispatcher, route = make([])

    async def run() -> None:
        call = asyncio.ensure_future(dispatcher.infer("m", Kind.REST, b"{}", None, None))
        await asyncio.sleep(0.05)
        status = dispatcher.table.find("m")
        status.state, status.reason = ModelState.FAILED, "quarantined: it crashed"
        dispatcher.drop(route)  # wakes the waiting request
        with pytest.raises(NotReady, match="failed to load: quarantined"):
            await call

    asyncio.run(run())


def test_no_waiting_while_stopping_or_beyond_the_pool_queue() -> None:
    dispatcher, route = make([], stopping=True)
    with pytest.raises(NotReady, match="shutting down"):
        asyncio.run(dispatcher.infer("m", Kind.REST, b"{}", None, None))
    dispatcher, route = make([], max_queue=2)
    route.waiting = 2  # max_queue per worker, one worker
    with pytest.raises(Overloaded, match="its workers are restarting"):
        asyncio.run(dispatcher.infer("m", Kind.REST, b"{}", None, None))
    with pytest.raises(NotReady, match="no ready replica"):
        asyncio.run(dispatcher.infer("other", Kind.REST, b"{}", None, None))


def test_a_lost_worker_leaves_the_routes_and_an_empty_route_turns_stale() -> None:
    workers = [FakeWorker(0), FakeWorker(1)]
    dispatcher, route = make(workers)
    dispatcher.worker_lost(workers[0])  # type: ignore[arg-type]
    assert route.ready == [workers[1]] and route.empty_since is None
    dispatcher.worker_lost(workers[1])  # type: ignore[arg-type]
    assert route.ready == [] and route.empty_since is not None
    now = time.monotonic()
    assert dispatcher.waited_too_long(now) == []
    assert dispatcher.waited_too_long(now + REPLICA_WAIT + 1) == ["m"]


def test_a_new_version_replaces_the_route() -> None:
    dispatcher, old = make([FakeWorker(0)])
    new = Route(ModelSettings(name="m"), 8, 0.0)
    assert dispatcher.publish(new) is old
    assert dispatcher.route_of(7) is None and dispatcher.route_of(8) is new
    assert dispatcher.current(new) and not dispatcher.current(old)
    assert not dispatcher.replica_ready(old, FakeWorker(1))  # type: ignore[arg-type]


def test_without_a_ready_replica_a_request_queues_behind_the_least_loaded_stalled_one() -> None:
    """``stalls.py`` moved both replicas to ``stalled``: no standby worker coming (the
    bound is reached), the request waits behind the long call, on the least-loaded one."""
    workers = [FakeWorker(0, busy=3), FakeWorker(1, busy=1)]
    dispatcher, route = make(workers)
    route.stalled, route.ready = route.ready, []

    async def run() -> None:
        call = asyncio.ensure_future(dispatcher.infer("m", Kind.REST, b"{}", None, None))
        await asyncio.sleep(0.05)
        [header] = workers[1].requests.pushed
        workers[1].inflight.pop(header.request_id).set_result(Reply(200, b"late"))
        assert (await call).body == b"late"

    asyncio.run(run())
    assert not workers[0].requests.pushed


def test_while_a_standby_worker_comes_a_request_waits_for_it() -> None:
    stalled, standby = FakeWorker(0, busy=1), FakeWorker(1)
    dispatcher, route = make([stalled])
    route.stalled, route.ready = route.ready, []
    route.standby_coming = True

    assert asyncio.run(takes_the_replica_back(dispatcher, route, standby)).body == b"back"
    assert not stalled.requests.pushed


def test_a_standby_worker_that_does_not_come_leaves_the_stalled_replica() -> None:
    stalled = FakeWorker(0, busy=1)
    dispatcher, route = make([stalled])
    route.stalled, route.ready = route.ready, []
    route.standby_coming = True

    async def run() -> None:
        call = asyncio.ensure_future(dispatcher.infer("m", Kind.REST, b"{}", None, None))
        await asyncio.sleep(0.05)
        route.standby_coming = False
        route.wake()  # it could not start
        await answer_when_pushed(stalled, b"behind")
        assert (await call).body == b"behind"

    asyncio.run(run())


def test_a_lost_stalled_worker_leaves_the_stalled_replicas() -> None:
    workers = [FakeWorker(0), FakeWorker(1)]
    dispatcher, route = make(workers)
    route.ready.remove(workers[0])  # type: ignore[arg-type]
    route.stalled.append(workers[0])  # type: ignore[arg-type]
    dispatcher.worker_lost(workers[0])  # type: ignore[arg-type]
    assert route.stalled == [] and route.ready == [workers[1]]


def test_the_early_check_refuses_exactly_what_dispatch_refuses() -> None:
    """``refusal`` (a frontend's check from the headers) says Overloaded exactly when
    ``infer`` would raise it now, with the same text, and changes nothing meanwhile."""
    workers = [FakeWorker(0, busy=2), FakeWorker(1, busy=1)]
    dispatcher, route = make(workers, max_queue=2)
    assert dispatcher.refusal("m") is None and route.turn == 0  # no side effect
    workers[1].inflight[-2] = None  # now every queue is full
    refused = dispatcher.refusal("m")
    assert refused is not None
    with pytest.raises(Overloaded) as raised:
        asyncio.run(dispatcher.infer("m", Kind.REST, b"{}", None, None))
    assert raised.value.message == refused.message
    assert "every replica's queue is full (2 requests per worker)" in refused.message
    del workers[0].inflight[-1]
    assert dispatcher.refusal("m") is None
    assert dispatcher.refusal("unpublished") is None  # left to infer (NotReady)


def test_the_early_check_follows_stalled_replicas_and_waiting_requests() -> None:
    workers = [FakeWorker(0, busy=2)]
    dispatcher, route = make(workers, max_queue=2)
    route.stalled, route.ready = route.ready, []
    assert dispatcher.refusal("m") is not None  # queues behind the stalled one: full
    route.standby_coming = True  # it would wait for the standby worker instead
    assert dispatcher.refusal("m") is None
    route.waiting = 2  # past the bound of requests waiting for a replica
    refused = dispatcher.refusal("m")
    assert refused is not None and "its workers are restarting" in refused.message
