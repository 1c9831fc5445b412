"""Loading by placement: which workers load a model, and loading it there again.

``Placement`` places a model's replicas with ``placement_choice.place`` (memory budget,
least loaded) by its footprint: the template's figure when the template loaded it, else the
first replica's, loaded on the worker with the most room. It publishes the route to the
dispatcher only once every replica is loaded, so a reload keeps the serving version
until the new one is in place (then the old one is unloaded). It unloads a model from
every worker, and when a worker replaces a dead one it loads the models that slot held
again (``reload``). Each version of a model is placed on its own, under its ``ModelKey``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from inferpool.engine.ipc import messages
from inferpool.engine.pool.dispatch import Dispatcher, Route
from inferpool.engine.pool.handles import WorkerHandle
from inferpool.engine.pool.load_blame import blame
from inferpool.engine.pool.placement_choice import MIB, PlacementError, WorkerRoom, place
from inferpool.engine.states import ModelKey, ModelState, ModelTable, model_key
from inferpool.errors import InferpoolError, ModelLoadError, NotReady, WorkerLost
from inferpool.settings import ModelSettings, ServerSettings

logger = logging.getLogger(__name__)

SERVING = (ModelState.READY, ModelState.LOADING)
LOAD_ATTEMPTS = 3  # a load that lost a worker to another model's load is tried again
RETRY_AFTER = 0.5  # seconds before it is (a dead worker's replacement starts meanwhile)


def set_state(
    table: ModelTable,
    key: ModelKey,
    state: ModelState,
    reason: str,
    when: tuple[ModelState, ...] = SERVING,
) -> None:
    """Move a listed model version to ``state`` if it is in one of ``when``."""
    status = table.get(key)
    if status is not None and status.state in when:
        status.state, status.reason = state, reason


class Capable(Protocol):
    """Which workers may hold a model, by capability (``roster.py``, ``groups.py``)."""

    def eligible(
        self, settings: ModelSettings, workers: list[WorkerHandle]
    ) -> tuple[list[WorkerHandle], dict[str, int]]: ...

    def eligible_slots(self, settings: ModelSettings) -> set[int]: ...


class Placement:
    """Loads and unloads models on the workers; the dispatcher learns the results."""

    def __init__(
        self,
        settings: ServerSettings,
        table: ModelTable,
        dispatcher: Dispatcher,
        alive: Callable[[], list[WorkerHandle]],
        capable: Capable,
        exit_status: Callable[[WorkerHandle], Awaitable[int | None]],
    ) -> None:
        self.table = table
        self.dispatcher = dispatcher
        self.alive = alive
        self.capable = capable
        self.exit_status = exit_status  # how a dead worker ended (``crash_blame.py``)
        self.default_timeout = settings.model_timeout
        limit = settings.worker_memory_limit
        self.memory_limit = limit * MIB if limit > 0 else None
        self._indexes = itertools.count(1)

    async def load(self, settings: ModelSettings, size: int | None = None) -> dict[str, Any]:
        """Load a model version's replicas and route its requests to them; its metadata.

        ``size``: the model's footprint when known (the template loaded it); else the first
        replica, loaded where there is the most room, tells it. A worker that died loading
        another model (``load_on`` blames that one) costs this one nothing: it is placed
        again on the workers running then.
        """
        for _ in range(LOAD_ATTEMPTS - 1):
            try:
                return await self._load(settings, size)
            except WorkerLost:
                await asyncio.sleep(RETRY_AFTER)  # its replacement may be up by then
        return await self._load(settings, size)

    async def _load(self, settings: ModelSettings, size: int | None) -> dict[str, Any]:
        started = self.started()
        if not started:
            raise NotReady("no worker is running")
        alive, refused = self.capable.eligible(settings, started)
        wanted = settings.replicas or max(1, len(alive))
        if not alive:
            self._place(settings.name, wanted, size or 0, [], refused)
        route = self.new_route(settings)
        key = route.key
        first: WorkerHandle | None = None
        before = len(alive)
        answer: messages.Loaded | None = None
        if size is None:
            by_slot = {worker.slot: worker for worker in alive}
            rooms = self.rooms(alive, key)
            first = by_slot[min(rooms, key=lambda r: (r.used, r.replicas, r.worker)).worker]
            answer = await self.load_on(first, route)
            size = answer.size
            alive, refused = self.capable.eligible(settings, self.started())
            if settings.replicas is None:
                # One per worker: a worker lost meanwhile (another model's load killed it)
                # gets its replica when its replacement is back (``reload``).
                wanted = max(1, len(alive))
        try:
            chosen = self._place(settings.name, wanted, size, self.rooms(alive, key), refused)
        except ModelLoadError:
            if first is not None:
                self.unload_from([first], key, route.index)
                if len(alive) < before:  # placed again once the lost worker is replaced
                    raise WorkerLost(f"a worker exited while {route.describe()} loaded") from None
            raise
        if first is not None and first.slot not in chosen:
            self.unload_from([first], key, route.index)
        by_slot = {worker.slot: worker for worker in alive}
        others = [by_slot[slot] for slot in chosen if first is None or slot != first.slot]
        results = await asyncio.gather(
            *(self.load_on(worker, route) for worker in others), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        placed = [w for w in others if w.alive and w.models.get(key, (None,))[0] == route.index]
        if first is not None and first.slot in chosen and first.alive:
            placed.insert(0, first)
        if errors:
            self.unload_from(placed, key, route.index)
            error = errors[0]
            raise error if isinstance(error, InferpoolError) else ModelLoadError(str(error))
        if answer is None:
            answer = next(r for r in results if isinstance(r, messages.Loaded))
        loaded = answer
        old = self.publish(route, placed, chosen, loaded, size)
        if old is not None:
            self.unload_from(self.alive(), key, old.index)
        return loaded.metadata

    def _place(
        self, name: str, wanted: int, size: int, rooms: list[WorkerRoom], refused: dict[str, int]
    ) -> list[int]:
        try:
            return place(name, wanted, size, rooms, self.memory_limit, refused)
        except PlacementError as exc:
            raise ModelLoadError(str(exc)) from None

    def publish(
        self,
        route: Route,
        placed: list[WorkerHandle],
        chosen: list[int],
        answer: messages.Loaded,
        size: int,
    ) -> Route | None:
        """``route`` serves from the workers ``placed`` on (in slots ``chosen``) from now on;
        the route it replaces, if any."""
        route.ready = placed
        route.slots = set(chosen)
        if route.settings.replicas is None:
            # One replica per worker that may hold it: slots that are restarting get theirs
            # when they are back.
            route.slots = self.capable.eligible_slots(route.settings)
        old = self.dispatcher.publish(route)
        predictor = answer.predictor
        logger.info(
            "%s: %d replica(s) on workers %s, %.1f MiB each%s",
            route.describe(), len(placed), [w.slot for w in placed], size / MIB,
            f"; predicted by {predictor}" if predictor else "",
        )  # fmt: skip
        return old

    def remove(self, route: Route) -> None:
        """No request goes to ``route`` any more, and no worker holds it."""
        self.dispatcher.drop(route)
        self.unload_from(self.alive(), route.key, route.index)

    async def reload(self, worker: WorkerHandle) -> None:
        """``worker`` replaced a dead one: load the models its slot held."""
        routes = self.dispatcher.routes.values()
        held = [route for route in routes if worker.slot in route.slots]
        await asyncio.gather(*(self._reload(worker, route) for route in held))

    async def _reload(self, worker: WorkerHandle, route: Route) -> None:
        try:
            await self.load_on(worker, route)
        except InferpoolError as exc:
            logger.error(
                "cannot reload %s on %s: %s", route.describe(), worker.describe(), exc.message
            )
            if not route.ready and self.dispatcher.current(route):
                set_state(self.table, route.key, ModelState.FAILED, exc.message)
                route.replica_back()  # its waiting requests fail now
            return
        if worker.retiring:
            return  # a new generation took over its slot while it loaded
        if self.dispatcher.replica_ready(route, worker):
            # A model that had no replica left comes back (FAILED included: the failure
            # was the pool's, a quarantined model has no route to reload).
            set_state(self.table, route.key, ModelState.READY, "", (*SERVING, ModelState.FAILED))

    async def load_on(self, worker: WorkerHandle, route: Route) -> messages.Loaded:
        """Load ``route``'s model on ``worker``; ModelLoadError with the reason, WorkerLost."""
        key, index = route.key, route.index
        future: asyncio.Future[messages.Loaded] = asyncio.get_running_loop().create_future()
        worker.loads[index] = future
        # The version it serves now, if any, stays its record when this load fails.
        previous = worker.models.get(key)
        worker.models[key] = (index, 0)
        load = messages.Load(index=index, settings=route.settings.model_dump(mode="json"))
        try:
            worker.post_control(load)
            answer = await future
            if not answer.ok:
                raise ModelLoadError(answer.error)
        except (OSError, InferpoolError) as exc:
            worker.loads.pop(index, None)
            if worker.models.get(key, (None,))[0] == index:
                if previous is None:
                    del worker.models[key]
                else:
                    worker.models[key] = previous
            if isinstance(exc, OSError | WorkerLost):
                await self._blame_load(worker, key)
            if isinstance(exc, OSError):
                raise WorkerLost(f"{worker.describe()} exited") from None
            raise
        worker.models[key] = (index, answer.size)
        return answer

    async def _blame_load(self, worker: WorkerHandle, key: ModelKey) -> None:
        """``worker`` died: ModelLoadError with the sentence if it was loading ``key``
        (``load_blame.py``); the model is never loaded again by this load."""
        culprit = worker.loading
        if culprit is None or model_key(culprit.name, culprit.version) != key:
            return
        status = await self.exit_status(worker)
        raise ModelLoadError(blame(culprit, status, worker.hung)) from None

    def unload_from(self, workers: list[WorkerHandle], key: ModelKey, index: int) -> None:
        """Unload the copy ``index`` of a model version from ``workers``.

        Sent to every live one, whatever its record says: a reload replaces the record
        with the new version while the worker still holds the old one (a worker ignores
        a version it does not hold).
        """
        message = messages.Unload(index=index)
        for worker in workers:
            if not worker.alive:
                continue
            if worker.models.get(key, (None,))[0] == index:
                del worker.models[key]
            with contextlib.suppress(OSError):
                worker.post_control(message)

    def new_route(self, settings: ModelSettings) -> Route:
        """A route for a version about to load, under a model index of its own."""
        return Route(settings, next(self._indexes), self.default_timeout)

    def started(self) -> list[WorkerHandle]:
        """The live workers that have started."""
        return [worker for worker in self.alive() if worker.hello.done()]

    @staticmethod
    def rooms(workers: list[WorkerHandle], key: ModelKey) -> list[WorkerRoom]:
        """What each of ``workers`` holds, leaving out the version under ``key``."""
        rooms = []
        for worker in workers:
            others = {k: v for k, v in worker.models.items() if k != key}
            used = sum(size for _, size in others.values())
            rooms.append(WorkerRoom(worker.slot, used, len(others)))
        return rooms
