"""Worker generations (engine/generations.py) over a fake supervisor and fake worker
handles: when a load goes through the template and rolls a new generation of workers,
what takes over, and what a failed roll leaves as it was."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferpool.engine.ipc import messages
from inferpool.engine.pool import generations as generations_module
from inferpool.engine.pool.dispatch import Dispatcher
from inferpool.engine.pool.generations import Generations
from inferpool.engine.pool.placement import Placement
from inferpool.engine.pool.placement_choice import MIB
from inferpool.engine.states import ModelTable
from inferpool.errors import ModelLoadError, NotReady
from inferpool.settings import ModelSettings, ServerSettings
from tests.unit.engine.fake_handles import AllCapable, FakeWorker


@pytest.fixture(autouse=True)
def fake_handles_are_worker_handles(monkeypatch) -> None:
    """``_spawn`` tells the workers that came up from the errors by their class."""
    monkeypatch.setattr(generations_module, "WorkerHandle", FakeWorker)


class FakeTemplate:
    """The running template: whether the current workers were forked holding a model."""

    def __init__(self) -> None:
        self.shared_by_all = False

    def shares(self, worker: Any, key: str) -> bool:
        return self.shared_by_all


class FakeKeeper:
    """The template keeper: its answer to each preload."""

    def __init__(self) -> None:
        self.answer: messages.PreloadResult | None = None
        self.asked: list[str] = []
        self.delay = 0.0

    async def preload(self, document: dict[str, Any]) -> messages.PreloadResult | None:
        self.asked.append(document["name"])
        await asyncio.sleep(self.delay)
        if self.answer is None:
            return None
        answer = self.answer
        return messages.PreloadResult(
            document["name"], None, answer.ok, answer.error, answer.size, shareable=True
        )


class FakeSupervisor:
    """What generations use of the Supervisor: slots, spawning and taking over."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.workers = [FakeWorker(slot) for slot in range(count)]
        self.templates = FakeKeeper()
        self.template = FakeTemplate()
        self.only_slots: set[int] | None = None  # a model only some slots may hold
        self.spare_error: dict[int, str] = {}  # slot → what its new worker's loads answer
        self.spawn_error: Exception | None = None
        self.spawned: list[FakeWorker] = []
        self.killed: list[FakeWorker] = []
        self.retired: list[FakeWorker] = []
        self.roster = self  # the slots a model may take (``pool/roster.py``)

    def eligible_slots(self, settings: ModelSettings) -> set[int]:
        return set(range(self.count)) if self.only_slots is None else self.only_slots

    def alive(self) -> list[FakeWorker]:
        return [worker for worker in self.workers if worker.alive]

    async def spawn(self, slot: int) -> FakeWorker:
        if self.spawn_error is not None and slot == self.count - 1:
            raise self.spawn_error
        spare = FakeWorker(slot, size=MIB, error=self.spare_error.get(slot, ""))
        self.spawned.append(spare)
        return spare

    def kill(self, worker: FakeWorker, reason: str, crash: bool) -> None:
        worker.alive = False
        self.killed.append(worker)

    def take_over(self, slot: int, worker: FakeWorker) -> FakeWorker:
        old, self.workers[slot] = self.workers[slot], worker
        self.retired.append(old)
        return old


def make(count: int = 2) -> tuple[Generations, FakeSupervisor, Placement]:
    supervisor = FakeSupervisor(count)
    table = ModelTable()
    dispatcher = Dispatcher(table, 4, count, lambda: False)
    placement = Placement(
        ServerSettings(),
        table,
        dispatcher,
        supervisor.alive,
        (capable := AllCapable(supervisor.workers)),  # type: ignore[arg-type]
        capable.exit_status,
    )
    generations = Generations(supervisor, placement, dispatcher)  # type: ignore[arg-type]
    return generations, supervisor, placement


def shared(size: int = 3 * MIB) -> messages.PreloadResult:
    return messages.PreloadResult("", None, True, "", size)


def slots_of(placement: Placement, name: str) -> list[int]:
    return sorted(worker.slot for worker in placement.dispatcher.routes[name].ready)


def test_a_model_only_some_slots_may_hold_is_placed_without_the_template() -> None:
    generations, supervisor, placement = make()
    supervisor.only_slots = {0}
    supervisor.templates.answer = shared()
    asyncio.run(generations.load(ModelSettings(name="m")))
    assert supervisor.templates.asked == []
    assert supervisor.spawned == []
    assert "m" in placement.dispatcher.routes


def test_a_model_the_template_cannot_load_fails_with_its_reason() -> None:
    generations, supervisor, placement = make()
    supervisor.templates.answer = messages.PreloadResult("", None, False, "no such file")
    with pytest.raises(ModelLoadError, match="no such file"):
        asyncio.run(generations.load(ModelSettings(name="m")))
    assert placement.dispatcher.routes == {}
    assert all(worker.sent == [] for worker in supervisor.workers)


def test_a_model_the_template_does_not_hold_is_loaded_by_each_worker() -> None:
    generations, supervisor, placement = make()
    supervisor.templates.answer = None
    asyncio.run(generations.load(ModelSettings(name="m")))
    assert supervisor.templates.asked == ["m"]
    assert supervisor.spawned == [] and generations.rolls == 0
    assert slots_of(placement, "m") == [0, 1]


def test_a_copy_every_worker_already_holds_is_placed_on_them_with_its_size() -> None:
    generations, supervisor, placement = make()
    supervisor.templates.answer = shared(7 * MIB)
    supervisor.template.shared_by_all = True
    asyncio.run(generations.load(ModelSettings(name="m")))
    assert supervisor.spawned == [] and generations.rolls == 0
    assert [worker.models["m"][1] for worker in supervisor.workers] == [MIB * 10, MIB * 10]
    assert slots_of(placement, "m") == [0, 1]


def test_a_new_copy_rolls_a_generation_that_takes_over_with_every_model() -> None:
    generations, supervisor, placement = make()
    old_workers = list(supervisor.workers)
    asyncio.run(placement.load(ModelSettings(name="kept"), size=MIB))
    kept = placement.dispatcher.routes["kept"]
    supervisor.templates.answer = shared()
    metadata = asyncio.run(generations.load(ModelSettings(name="m", replicas=1)))
    assert metadata["name"] == "m"
    assert generations.rolls == 1
    spares = supervisor.spawned
    assert [spare.slot for spare in spares] == [0, 1]
    assert supervisor.workers == spares and supervisor.retired == old_workers
    # Every new worker loads what its slot held, under the same model index.
    assert all(kept.index in spare.loaded() for spare in spares)
    assert kept.ready == spares
    # The new version's one replica is on one new worker.
    route = placement.dispatcher.routes["m"]
    assert len(route.ready) == 1 and route.ready[0] in spares
    assert sum(route.index in spare.loaded() for spare in spares) == 1


def test_loads_that_come_together_cost_one_roll() -> None:
    generations, supervisor, placement = make()
    supervisor.templates.answer = shared()
    supervisor.templates.delay = 0.05

    async def both() -> None:
        await asyncio.gather(
            generations.load(ModelSettings(name="a")), generations.load(ModelSettings(name="b"))
        )

    asyncio.run(both())
    assert generations.rolls == 1
    assert len(supervisor.spawned) == 2
    assert slots_of(placement, "a") == slots_of(placement, "b") == [0, 1]


def test_a_failed_load_in_a_new_worker_leaves_the_current_generation_serving() -> None:
    generations, supervisor, placement = make()
    old_workers = list(supervisor.workers)
    asyncio.run(placement.load(ModelSettings(name="kept"), size=MIB))
    supervisor.templates.answer = shared()
    supervisor.spare_error = {1: "out of memory"}
    with pytest.raises(ModelLoadError, match="of the new generation: out of memory"):
        asyncio.run(generations.load(ModelSettings(name="m")))
    assert supervisor.workers == old_workers and generations.rolls == 0
    assert supervisor.killed == supervisor.spawned
    assert "m" not in placement.dispatcher.routes
    assert placement.dispatcher.routes["kept"].ready == old_workers


def test_a_new_worker_that_does_not_come_up_fails_the_roll() -> None:
    generations, supervisor, placement = make()
    supervisor.templates.answer = shared()
    supervisor.spawn_error = NotReady("the worker template process is not running")
    with pytest.raises(NotReady, match="template process is not running"):
        asyncio.run(generations.load(ModelSettings(name="m")))
    assert supervisor.killed == supervisor.spawned  # the one that came up is closed
    assert "m" not in placement.dispatcher.routes


def test_a_copy_too_big_for_the_budget_fails_without_a_roll_taking_over() -> None:
    generations, supervisor, placement = make()
    placement.memory_limit = 2 * MIB
    supervisor.templates.answer = shared(5 * MIB)
    with pytest.raises(ModelLoadError, match="cannot place 2 replicas of 'm'"):
        asyncio.run(generations.load(ModelSettings(name="m")))
    assert "m" not in placement.dispatcher.routes
