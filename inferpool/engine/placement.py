"""Loading by placement: which workers load a model, and loading it there again.

``Placement`` loads the first replica on the worker with the most room (its answer
tells the model's size), places the others with ``scheduler.place`` (memory budget,
least loaded), and publishes the route to the dispatcher only once every replica is
loaded, so a reload keeps the serving version until the new one is in place (then the
old one is unloaded). It unloads a model from every worker, and when a worker replaces
a dead one it loads the models that slot held again (``reload``). Each version of a model
is placed on its own, under its ``ModelKey``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any

from inferpool.engine.dispatch import Dispatcher, Route
from inferpool.engine.handles import WorkerHandle
from inferpool.engine.ipc import messages
from inferpool.engine.scheduler import MIB, PlacementError, WorkerRoom, place
from inferpool.engine.states import ModelKey, ModelState, ModelTable
from inferpool.errors import InferpoolError, ModelLoadError, NotReady, WorkerLost
from inferpool.settings import ModelSettings, ServerSettings

logger = logging.getLogger(__name__)

SERVING = (ModelState.READY, ModelState.LOADING)


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


class Placement:
    """Loads and unloads models on the workers; the dispatcher learns the results."""

    def __init__(
        self,
        settings: ServerSettings,
        table: ModelTable,
        dispatcher: Dispatcher,
        alive: Callable[[], list[WorkerHandle]],
    ) -> None:
        self.table = table
        self.dispatcher = dispatcher
        self.alive = alive
        self.count = settings.workers
        self.default_timeout = settings.model_timeout
        limit = settings.worker_memory_limit
        self.memory_limit = limit * MIB if limit > 0 else None
        self._indexes = itertools.count(1)

    async def load(self, settings: ModelSettings) -> dict[str, Any]:
        """Load a model version's replicas and route its requests to them; its metadata."""
        alive = self._started()
        if not alive:
            raise NotReady("no worker is running")
        wanted = settings.replicas or len(alive)
        route = Route(settings, next(self._indexes), self.default_timeout)
        key = route.key
        by_slot = {worker.slot: worker for worker in alive}
        # The first replica goes where there is the most room; it tells the model's size.
        rooms = self._rooms(alive, key)
        first = by_slot[min(rooms, key=lambda r: (r.used, r.replicas, r.worker)).worker]
        answer = await self._load_on(first, route)
        size = answer.size
        alive = self._started()
        try:
            chosen = place(settings.name, wanted, size, self._rooms(alive, key), self.memory_limit)
        except PlacementError as exc:
            self.unload_from([first], key, route.index)
            raise ModelLoadError(str(exc)) from None
        if first.slot not in chosen:
            self.unload_from([first], key, route.index)
        by_slot = {worker.slot: worker for worker in alive}
        others = [by_slot[slot] for slot in chosen if slot != first.slot]
        results = await asyncio.gather(
            *(self._load_on(worker, route) for worker in others), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        placed = [w for w in others if w.alive and w.models.get(key, (None,))[0] == route.index]
        if first.slot in chosen and first.alive:
            placed.insert(0, first)
        if errors:
            self.unload_from(placed, key, route.index)
            error = errors[0]
            raise error if isinstance(error, InferpoolError) else ModelLoadError(str(error))
        route.ready = placed
        route.slots = set(chosen)
        if settings.replicas is None:
            # One replica per worker: slots that are restarting get theirs when they are back.
            route.slots = set(range(self.count))
        old = self.dispatcher.publish(route)
        if old is not None:
            self.unload_from(self.alive(), key, old.index)
        predictor = answer.predictor
        logger.info(
            "%s: %d replica(s) on workers %s, %.1f MiB each%s",
            route.describe(), len(placed), [w.slot for w in placed], size / MIB,
            f"; predicted by {predictor}" if predictor else "",
        )  # fmt: skip
        return answer.metadata

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
            await self._load_on(worker, route)
        except InferpoolError as exc:
            logger.error(
                "cannot reload %s on %s: %s", route.describe(), worker.describe(), exc.message
            )
            if not route.ready and self.dispatcher.current(route):
                set_state(self.table, route.key, ModelState.FAILED, exc.message)
                route.replica_back()  # its waiting requests fail now
            return
        if self.dispatcher.replica_ready(route, worker):
            # A model that had no replica left comes back (FAILED included: the failure
            # was the pool's, a quarantined model has no route to reload).
            set_state(self.table, route.key, ModelState.READY, "", (*SERVING, ModelState.FAILED))

    async def _load_on(self, worker: WorkerHandle, route: Route) -> messages.Loaded:
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
            if isinstance(exc, OSError):
                raise WorkerLost(f"{worker.describe()} exited") from None
            raise
        worker.models[key] = (index, answer.size)
        return answer

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

    def _started(self) -> list[WorkerHandle]:
        return [worker for worker in self.alive() if worker.hello.done()]

    @staticmethod
    def _rooms(workers: list[WorkerHandle], key: ModelKey) -> list[WorkerRoom]:
        rooms = []
        for worker in workers:
            others = {k: v for k, v in worker.models.items() if k != key}
            used = sum(size for _, size in others.values())
            rooms.append(WorkerRoom(worker.slot, used, len(others)))
        return rooms
