"""Loading by placement (engine/placement.py over scheduler.py), on fake worker handles
that answer a Load at once: where replicas go, what a reload and a new version do, and
what a failed or lost load leaves behind."""

from __future__ import annotations

import asyncio

import pytest

from inferpool.engine.ipc import messages
from inferpool.engine.pool import placement as placement_module
from inferpool.engine.pool.dispatch import Dispatcher
from inferpool.engine.pool.placement import Placement
from inferpool.engine.pool.placement_choice import MIB
from inferpool.engine.states import ModelState, ModelStatus, ModelTable
from inferpool.errors import ModelLoadError, NotReady, WorkerLost
from inferpool.settings import ModelSettings, ServerSettings
from tests.unit.engine.fake_handles import AllCapable, FakeWorker


def make(workers: list[FakeWorker], memory_limit_mib: int = 0) -> tuple[Placement, ModelTable]:
    table = ModelTable()
    dispatcher = Dispatcher(table, 4, len(workers), lambda: False)
    settings = ServerSettings(worker_memory_limit=memory_limit_mib)
    placement = Placement(
        settings,
        table,
        dispatcher,
        lambda: list(workers),
        (capable := AllCapable(workers)),  # type: ignore[arg-type]
        capable.exit_status,
    )
    return placement, table


def test_replicas_go_to_the_least_loaded_workers_and_the_route_is_published() -> None:
    workers = [FakeWorker(0), FakeWorker(1), FakeWorker(2)]
    workers[0].models["other"] = (1, 30 * MIB)  # the busiest worker
    placement, _ = make(workers)
    metadata = asyncio.run(placement.load(ModelSettings(name="m", replicas=2)))
    route = placement.dispatcher.routes["m"]
    # The first replica (that tells the size) goes where there is the most room: worker 1.
    assert metadata == {"name": "m", "slot": 1}
    assert [worker.slot for worker in route.ready] == [1, 2]
    assert route.slots == {1, 2}
    assert workers[0].loaded() == []
    assert workers[1].models["m"] == (route.index, 10 * MIB)
    assert workers[2].models["m"] == (route.index, 10 * MIB)


def test_a_model_with_no_replica_count_is_on_every_worker_and_every_slot() -> None:
    workers = [FakeWorker(0), FakeWorker(1)]
    placement, _ = make(workers)
    asyncio.run(placement.load(ModelSettings(name="m"), size=5 * MIB))
    route = placement.dispatcher.routes["m"]
    assert sorted(worker.slot for worker in route.ready) == [0, 1]
    assert route.slots == {0, 1}


def test_the_memory_budget_keeps_a_full_worker_out() -> None:
    workers = [FakeWorker(0), FakeWorker(1), FakeWorker(2)]
    workers[2].models["big"] = (1, 50 * MIB)
    placement, _ = make(workers, memory_limit_mib=60)
    asyncio.run(placement.load(ModelSettings(name="m", replicas=2), size=20 * MIB))
    assert sorted(w.slot for w in placement.dispatcher.routes["m"].ready) == [0, 1]
    with pytest.raises(ModelLoadError, match="cannot place 3 replicas of 'n'"):
        asyncio.run(placement.load(ModelSettings(name="n", replicas=3), size=20 * MIB))
    assert "n" not in placement.dispatcher.routes


def test_a_first_replica_outside_the_chosen_workers_is_unloaded() -> None:
    """The first replica told a size that fits nowhere: it is unloaded, nothing published."""
    workers = [FakeWorker(0, size=100 * MIB), FakeWorker(1, size=100 * MIB)]
    placement, _ = make(workers, memory_limit_mib=60)
    with pytest.raises(ModelLoadError, match="cannot place 1 replica of 'm'"):
        asyncio.run(placement.load(ModelSettings(name="m", replicas=1)))
    [first] = [worker for worker in workers if worker.loaded()]
    assert first.unloaded() == first.loaded()
    assert "m" not in first.models
    assert placement.dispatcher.routes == {}


def test_a_replica_that_fails_to_load_unloads_the_others() -> None:
    workers = [FakeWorker(0), FakeWorker(1, error="bad pickle"), FakeWorker(2)]
    placement, _ = make(workers)
    with pytest.raises(ModelLoadError, match="bad pickle"):
        asyncio.run(placement.load(ModelSettings(name="m", replicas=3), size=MIB))
    assert placement.dispatcher.routes == {}
    for worker in (workers[0], workers[2]):
        assert worker.unloaded() == worker.loaded()
        assert "m" not in worker.models
    assert "m" not in workers[1].models  # its record is rolled back


def test_a_new_version_replaces_the_old_one_which_is_then_unloaded() -> None:
    workers = [FakeWorker(0), FakeWorker(1)]
    placement, _ = make(workers)
    asyncio.run(placement.load(ModelSettings(name="m"), size=MIB))
    old = placement.dispatcher.routes["m"]
    asyncio.run(placement.load(ModelSettings(name="m"), size=MIB))
    new = placement.dispatcher.routes["m"]
    assert new.index != old.index
    for worker in workers:
        assert worker.unloaded() == [old.index]
        assert worker.models["m"][0] == new.index
    placement.remove(new)
    assert placement.dispatcher.routes == {}
    assert all(worker.unloaded() == [old.index, new.index] for worker in workers)


def test_no_started_worker_is_not_ready() -> None:
    placement, _ = make([])
    with pytest.raises(NotReady, match="no worker is running"):
        asyncio.run(placement.load(ModelSettings(name="m")))


def test_a_load_whose_workers_are_lost_is_tried_again_then_says_so(monkeypatch) -> None:
    monkeypatch.setattr(placement_module, "RETRY_AFTER", 0)
    workers = [FakeWorker(0, gone=True)]
    placement, _ = make(workers)
    with pytest.raises(WorkerLost, match="worker 0 exited"):
        asyncio.run(placement.load(ModelSettings(name="m"), size=MIB))
    assert workers[0].models == {} and workers[0].loads == {}


class KillsASibling(FakeWorker):
    """Loading a model here kills ``sibling`` (another model's load crashed it meanwhile)."""

    def __init__(self, slot: int, sibling: FakeWorker) -> None:
        super().__init__(slot)
        self.sibling = sibling

    def post_control(self, message: messages.Control) -> None:
        if isinstance(message, messages.Load):
            # Its first load: the sibling dies; the next: its replacement is up.
            self.sibling.alive = bool(self.loaded())
        super().post_control(message)


def living(workers: list[FakeWorker]) -> Placement:
    placement, _ = make(workers)
    placement.alive = lambda: [worker for worker in workers if worker.alive]  # type: ignore[assignment,misc]
    return placement


def test_a_worker_lost_during_the_first_load_leaves_one_replica_per_worker_placeable() -> None:
    """One replica per worker: the one lost while the first replica told the size gets its
    replica when replaced; the others are placed now (the CI race of 2026-12-06)."""
    workers: list[FakeWorker] = [FakeWorker(1)]
    workers.insert(0, KillsASibling(0, workers[0]))
    placement = living(workers)
    asyncio.run(placement.load(ModelSettings(name="m")))
    route = placement.dispatcher.routes["m"]
    assert [worker.slot for worker in route.ready] == [0]
    assert route.slots == {0, 1}  # the lost slot's replacement loads it (reload)


def test_a_worker_lost_during_the_first_load_is_waited_for_with_a_replica_count(
    monkeypatch,
) -> None:
    monkeypatch.setattr(placement_module, "RETRY_AFTER", 0)
    workers: list[FakeWorker] = [FakeWorker(1)]
    workers.insert(0, KillsASibling(0, workers[0]))
    placement = living(workers)
    asyncio.run(placement.load(ModelSettings(name="m", replicas=2)))
    route = placement.dispatcher.routes["m"]
    assert sorted(worker.slot for worker in route.ready) == [0, 1]
    first, second = workers[0].loaded()  # tried again once the lost worker was back
    assert workers[0].unloaded() == [first]
    assert workers[0].models["m"][0] == second == route.index


def test_a_replacement_worker_loads_what_its_slot_held_and_the_model_is_back() -> None:
    workers = [FakeWorker(0), FakeWorker(1)]
    placement, table = make(workers)
    table.set(ModelStatus("m", None, ModelState.READY))
    asyncio.run(placement.load(ModelSettings(name="m"), size=MIB))
    route = placement.dispatcher.routes["m"]
    placement.dispatcher.worker_lost(workers[1])  # type: ignore[arg-type]
    replacement = FakeWorker(1)
    workers[1] = replacement
    table.get("m").state = ModelState.FAILED  # type: ignore[union-attr]
    asyncio.run(placement.reload(replacement))  # type: ignore[arg-type]
    assert replacement.loaded() == [route.index]
    assert replacement in route.ready
    assert table.get("m").state is ModelState.READY  # type: ignore[union-attr]


def test_a_failed_reload_of_a_model_with_no_replica_left_fails_it() -> None:
    workers = [FakeWorker(0)]
    placement, table = make(workers)
    table.set(ModelStatus("m", None, ModelState.READY))
    asyncio.run(placement.load(ModelSettings(name="m"), size=MIB))
    route = placement.dispatcher.routes["m"]
    placement.dispatcher.worker_lost(workers[0])  # type: ignore[arg-type]
    assert route.ready == []
    replacement = FakeWorker(0, error="out of memory")
    asyncio.run(placement.reload(replacement))  # type: ignore[arg-type]
    status = table.get("m")
    assert status is not None
    assert (status.state, status.reason) == (ModelState.FAILED, "out of memory")
