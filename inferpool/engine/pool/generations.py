"""Worker generations: models loaded after start-up shared copy-on-write, as start-up ones.

A model whose runtime allows it is loaded once, by the template process (``TemplateKeeper.
preload``), which answers with its footprint or the reason it failed (then the load fails
and a serving previous version keeps serving). Workers forked after that hold the copy;
if every worker does (start-up: the template preloaded before forking; a reload of
unchanged files), the model is placed on them as any other (``Placement.load``: they take
the copy). Otherwise a *new generation* rolls: the template forks one new worker per slot,
each loads what its slot holds now under the same model indexes, plus the new versions
placed on it; once every load answered, the new workers take over in one step (slots,
each route's replicas, the new routes published, all without an await between), and the
old ones retire: they finish what they hold, then exit (``Supervisor.retire``). A roll
that fails (a new worker dies, a load fails) closes the new workers and leaves everything
as it was.

Rolls run one at a time, and each takes every load queued when it starts (those whose
template load is still under way too), so that loads that arrive together cost one roll.
A roll and ordinary placements exclude each other (``Gate``): a route published while a
roll runs would miss its new workers. Models the template does not hold (their runtime
is not fork-safe, or their load started a thread there) are loaded by each worker, and
by each new worker of a roll like any model its slot holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from inferpool.engine.ipc import messages
from inferpool.engine.pool.dispatch import Dispatcher, Route
from inferpool.engine.pool.handles import WorkerHandle
from inferpool.engine.pool.placement import Placement
from inferpool.engine.pool.placement_choice import PlacementError, WorkerRoom, place
from inferpool.engine.pool.supervisor import Supervisor
from inferpool.engine.states import ModelKey, model_key
from inferpool.errors import InferpoolError, ModelLoadError, NotReady
from inferpool.settings import ModelSettings

logger = logging.getLogger(__name__)


class Gate:
    """Placements run side by side (``shared``); a roll runs alone (``exclusive``), and a
    roll that waits keeps new placements out until it is done."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._shared = 0
        self._rolling = False

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._rolling)
            self._shared += 1
        try:
            yield
        finally:
            async with self._changed:
                self._shared -= 1
                self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._rolling)
            self._rolling = True
            await self._changed.wait_for(lambda: self._shared == 0)
        try:
            yield
        finally:
            async with self._changed:
                self._rolling = False
                self._changed.notify_all()


@dataclass(eq=False)
class Pending:
    """A model version the next roll brings in."""

    route: Route
    size: int  # its footprint, as the template measured it
    done: asyncio.Future[dict[str, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    slots: list[int] = field(default_factory=list)  # where the roll places it


@dataclass(eq=False)
class _Load:
    """One load of a roll: ``route`` on the new ``worker``, for ``pending`` (None: a
    version served already)."""

    worker: WorkerHandle
    route: Route
    pending: Pending | None
    result: messages.Loaded | BaseException | None = None


class Generations:
    """Loads of the models the template shares, rolling new generations when needed."""

    def __init__(
        self, supervisor: Supervisor, placement: Placement, dispatcher: Dispatcher
    ) -> None:
        self.supervisor = supervisor
        self.placement = placement
        self.dispatcher = dispatcher
        self.gate = Gate()
        self.rolls = 0  # new generations that took over (the log counts them)
        self._queue: list[Pending] = []
        self._roller: asyncio.Task[None] | None = None
        self._preloading = 0  # template loads under way: a roll waits for them
        self._preloaded = asyncio.Event()

    async def load(self, settings: ModelSettings) -> dict[str, Any]:
        """Load a model version, shared through the template when it may be; its metadata."""
        if not self._shareable(settings):
            async with self.gate.shared():  # not across a roll of the workers it may use
                return await self.placement.load(settings)
        self._preloading += 1
        self._preloaded.clear()
        try:
            copy = await self.supervisor.templates.preload(settings.model_dump(mode="json"))
        finally:
            self._preloading -= 1
            if not self._preloading:
                self._preloaded.set()
        if copy is not None and not copy.ok:
            raise ModelLoadError(copy.error)
        async with self.gate.shared():
            if copy is None or self._shared_by_all(model_key(settings.name, settings.version)):
                return await self.placement.load(settings, None if copy is None else copy.size)
        pending = Pending(self.placement.new_route(settings), copy.size)
        self._queue.append(pending)
        if self._roller is None or self._roller.done():
            self._roller = asyncio.ensure_future(self._roll_queued())
        return await pending.done

    def _shareable(self, settings: ModelSettings) -> bool:
        """The model may go to every worker the server's template forks, and to no other
        (a new generation is forked by that template): else each worker loads its own."""
        return self.supervisor.roster.eligible_slots(settings) == set(range(self.supervisor.count))

    def _shared_by_all(self, key: ModelKey) -> bool:
        """Every worker was forked holding the template's current copy of ``key``."""
        template = self.supervisor.template
        workers = [w for w in self.placement.started() if w.slot < self.supervisor.count]
        return template is not None and all(template.shares(w, key) for w in workers)

    async def _roll_queued(self) -> None:
        while self._queue:
            if self._preloading:
                # Loads whose template load is under way come along in this roll.
                await self._preloaded.wait()
            batch, self._queue = self._queue, []
            try:
                self._queue.extend(await self._roll(batch))
            except Exception as exc:  # each waiting load gets the reason
                if not isinstance(exc, InferpoolError):
                    logger.exception("a new generation of workers failed")
                    exc = ModelLoadError(f"a new generation of workers failed: {exc}")
                for pending in batch:
                    if not pending.done.done():
                        pending.done.set_exception(exc)

    async def _roll(self, batch: list[Pending]) -> list[Pending]:
        """Roll one new generation bringing ``batch`` in; the loads to try again in the
        next one (this one failed because of another load of the batch)."""
        async with self.gate.exclusive():
            spares = await self._spawn()
            try:
                incoming = {pending.route.key for pending in batch}
                # Only routes on the slots this template forks: an environment's workers
                # are not part of the generation, and keep their replicas.
                forked = set(range(self.supervisor.count))
                kept = [
                    r
                    for r in self.dispatcher.routes.values()
                    if r.key not in incoming and r.slots <= forked
                ]
                placed = self._place(batch, kept)
                loads = [
                    _Load(spare, route, pending)
                    for spare in spares
                    for route, pending in [
                        *((route, None) for route in kept if spare.slot in route.slots),
                        *((p.route, p) for p in placed if spare.slot in p.slots),
                    ]
                ]
                results = await asyncio.gather(
                    *(self.placement.load_on(load.worker, load.route) for load in loads),
                    return_exceptions=True,
                )
            except BaseException:
                self._close(spares)
                raise
            for load, result in zip(loads, results, strict=True):
                load.result = result
            failed = [load for load in loads if isinstance(load.result, BaseException)]
            if failed:
                self._close(spares)
                return self._failed(batch, failed)
            self._take_over(spares, kept, placed, loads)
            return []

    async def _spawn(self) -> list[WorkerHandle]:
        """One new worker per slot, forked by the template as it is now."""
        started = await asyncio.gather(
            *(self.supervisor.spawn(slot) for slot in range(self.supervisor.count)),
            return_exceptions=True,
        )
        spares = [w for w in started if isinstance(w, WorkerHandle)]
        errors = [e for e in started if isinstance(e, BaseException)]
        if errors:
            self._close(spares)
            error = errors[0]
            raise error if isinstance(error, InferpoolError) else NotReady(str(error))
        return spares

    def _close(self, spares: list[WorkerHandle]) -> None:
        for spare in spares:
            self.supervisor.kill(spare, f"{spare.describe()} of a new generation closed", False)

    def _place(self, batch: list[Pending], kept: list[Route]) -> list[Pending]:
        """Choose the slots of each incoming version by the template's size (the slots
        hold what they hold now); one that does not fit fails now."""
        count = self.supervisor.count
        used, replicas = [0] * count, [0] * count
        kept_keys = {route.key for route in kept}
        for worker in self.supervisor.alive():
            for key, (_, size) in worker.models.items():
                if key in kept_keys:
                    used[worker.slot] += size
                    replicas[worker.slot] += 1
        placed = []
        for pending in batch:
            rooms = [WorkerRoom(slot, used[slot], replicas[slot]) for slot in range(count)]
            settings = pending.route.settings
            wanted = settings.replicas or count
            limit = self.placement.memory_limit
            try:
                pending.slots = place(settings.name, wanted, pending.size, rooms, limit)
            except PlacementError as exc:
                if not pending.done.done():  # (its caller may have gone)
                    pending.done.set_exception(ModelLoadError(str(exc)))
                continue
            for slot in pending.slots:
                used[slot] += pending.size
                replicas[slot] += 1
            placed.append(pending)
        return placed

    def _failed(self, batch: list[Pending], failed: list[_Load]) -> list[Pending]:
        """The new generation did not take over: each incoming load that failed gets its
        reason; the others go in the next roll, unless a version served already failed
        (then they all fail with its reason)."""
        first = failed[0]
        reason = _reason(first)
        logger.error(
            "a new generation of workers did not take over (the current one keeps serving): "
            "%s", reason.message,
        )  # fmt: skip
        blocked = any(load.pending is None for load in failed)
        again = []
        for pending in batch:
            if pending.done.done():
                continue
            own = next((load for load in failed if load.pending is pending), None)
            if own is not None:
                pending.done.set_exception(_reason(own))
            elif blocked:
                pending.done.set_exception(reason)
            else:
                again.append(pending)
        return again

    def _take_over(
        self, spares: list[WorkerHandle], kept: list[Route], placed: list[Pending],
        loads: list[_Load],
    ) -> None:  # fmt: skip
        """The new generation serves from now on: no await in here."""
        holders: dict[int, list[WorkerHandle]] = {}
        for load in loads:
            holders.setdefault(load.route.index, []).append(load.worker)
        retired = [self.supervisor.take_over(spare.slot, spare) for spare in spares]
        for route in kept:
            if self.dispatcher.current(route):
                route.ready = holders.get(route.index, [])
                route.replica_back()
            else:  # unloaded or quarantined meanwhile
                self.placement.unload_from(holders.get(route.index, []), route.key, route.index)
        for pending in placed:
            workers = holders.get(pending.route.index, [])
            if pending.done.done():  # its caller went away: not published
                self.placement.unload_from(workers, pending.route.key, pending.route.index)
                continue
            answer = next(
                load.result
                for load in loads
                if load.pending is pending and isinstance(load.result, messages.Loaded)
            )
            self.placement.publish(pending.route, workers, pending.slots, answer, pending.size)
            pending.done.set_result(answer.metadata)
        self.rolls += 1
        logger.info(
            "a new generation of workers took over (pids %s; roll %d); the old one (pids %s) "
            "drains", [w.pid for w in spares], self.rolls,
            [w.pid for w in retired if w is not None and w.alive],
        )  # fmt: skip


def _reason(load: _Load) -> InferpoolError:
    """Why ``load`` failed, naming the model and the worker."""
    error = load.result
    message = error.message if isinstance(error, InferpoolError) else str(error)
    text = f"{load.route.describe()} on {load.worker.describe()} of the new generation: {message}"
    return ModelLoadError(text)
