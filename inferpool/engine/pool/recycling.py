"""Recycling: a worker that served too long or holds too much is drained and replaced.

Three things make a worker of the server's own template due (``Recycler.tick``, every
``SUPERVISE_INTERVAL``):

- ``max_requests``: it was sent ``--worker-max-requests`` requests, plus a share of up
  to a tenth more drawn for each worker (``JITTER``), so that workers started together do
  not all go together (gunicorn's ``max_requests_jitter``);
- ``max_rss``: its private memory (USS: the pages no other process maps, read from
  ``/proc/PID/smaps_rollup`` every ``MEASURE_INTERVAL``) reached ``--worker-max-rss``;
  pages shared copy-on-write with the template and the other workers never count;
- ``memory_limit``: it hit its ``--worker-memory-limit`` and asked to be replaced
  (``Recycle``, from ``worker/memory_limit.py``).

A recycle is a one-worker generation (``generations.py`` rolls every slot; this rolls
one): the template forks a fresh worker for the slot, it loads what the slot holds
(sharing the template's copies), then takes over in one step without an await (the
slot, and its place in each route's replicas), and the old worker retires: it answers
what it holds, then exits (``Supervisor.retire``). No request fails: until the step,
the old worker serves; after it, the new one. Recycles run one at a time, and never
beside a roll or a placement (``Gate``). One that fails (the fresh worker dies, a load
fails) closes the fresh worker; the old one keeps serving and is tried again after
``RETRY_AFTER``. The workers of an environment's group are not recycled.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref

from inferpool.engine.pool.dispatch import Dispatcher, Route
from inferpool.engine.pool.generations import Generations
from inferpool.engine.pool.handles import WorkerHandle
from inferpool.engine.pool.placement import Placement
from inferpool.engine.pool.placement_choice import MIB
from inferpool.engine.pool.supervisor import Supervisor
from inferpool.errors import InferpoolError
from inferpool.settings import ServerSettings

logger = logging.getLogger(__name__)

REASONS = ("max_requests", "max_rss", "memory_limit")  # the metric's label values
JITTER = 0.1  # a worker's max_requests is drawn in [N, N + N * JITTER]
MEASURE_INTERVAL = 0.25  # seconds between two readings of the workers' private memory
RETRY_AFTER = 30.0  # seconds before a worker whose recycle failed is tried again


def private_bytes(pid: int) -> int | None:
    """The memory only process ``pid`` maps (USS), or None if it is gone."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Private_Hugetlb:")):
                    total += int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return total


class Recycler:
    """Decides which worker is due, and replaces it through a one-worker generation."""

    def __init__(
        self,
        settings: ServerSettings,
        supervisor: Supervisor,
        generations: Generations,
        placement: Placement,
        dispatcher: Dispatcher,
    ) -> None:
        self.max_requests = settings.worker_max_requests
        self.max_rss = settings.worker_max_rss * MIB
        self.supervisor = supervisor
        self.generations = generations
        self.placement = placement
        self.dispatcher = dispatcher
        self.counts = dict.fromkeys(REASONS, 0)  # recycles done, by reason (metrics)
        self._budgets: weakref.WeakKeyDictionary[WorkerHandle, int] = weakref.WeakKeyDictionary()
        self._retry: weakref.WeakKeyDictionary[WorkerHandle, float] = weakref.WeakKeyDictionary()
        self._measured = 0.0
        self._running = False  # a recycle runs (under the supervisor: stop cancels it)

    def tick(self, now: float) -> None:
        """Start recycling the first worker that is due, unless a recycle runs."""
        if self._running or self.supervisor.stopping():
            return
        measure = self.max_rss > 0 and now - self._measured >= MEASURE_INTERVAL
        if measure:
            self._measured = now
        for worker in self.supervisor.workers[: self.supervisor.count]:
            if worker is None or not worker.alive or not worker.hello.done():
                continue
            if now < self._retry.get(worker, 0.0):
                continue
            due = self._due(worker, measure)
            if due is not None:
                self._running = True
                self.supervisor.keep(self._recycle(worker, *due))
                return

    def _due(self, worker: WorkerHandle, measure: bool) -> tuple[str, str] | None:
        """(reason, sentence) if ``worker`` is due."""
        if worker.recycle is not None:
            return "memory_limit", f"{worker.describe()}: {worker.recycle.detail}"
        if self.max_requests > 0:
            budget = self._budgets.get(worker)
            if budget is None:
                extra = random.randint(0, int(self.max_requests * JITTER))
                budget = self._budgets[worker] = self.max_requests + extra
            sent = worker.requests_sent
            if sent >= budget:
                return "max_requests", (
                    f"{worker.describe()} was sent {sent} requests "
                    f"(--worker-max-requests {self.max_requests})"
                )
        if measure and worker.pid:
            held = private_bytes(worker.pid)
            if held is not None and held >= self.max_rss:
                return self._over_rss(worker, held)
        return None

    def _over_rss(self, worker: WorkerHandle, held: int) -> tuple[str, str] | None:
        """A worker over ``max_rss``: due, unless it was so before serving anything (a
        fresh one would be too: the limit is below what the models cost; it is then
        given up, said once)."""
        limit = self.max_rss // MIB
        if worker.requests_sent == 0:
            logger.error(
                "%s holds %d MiB of its own before serving a request, over --worker-max-rss "
                "%d MiB: a fresh worker would too; workers are not recycled for their memory",
                worker.describe(), held // MIB, limit,
            )  # fmt: skip
            self.max_rss = 0
            return None
        return "max_rss", (
            f"{worker.describe()} holds {held // MIB} MiB of private memory "
            f"(--worker-max-rss {limit} MiB)"
        )

    def _current(self, worker: WorkerHandle) -> bool:
        return worker.alive and self.supervisor.workers[worker.slot] is worker

    async def _recycle(self, old: WorkerHandle, reason: str, why: str) -> None:
        logger.info("%s; replacing it by a fresh worker", why)
        try:
            async with self.generations.gate.exclusive():
                if self._current(old):
                    await self._replace(old, reason)
        except InferpoolError as exc:
            self._failed(old, exc.message)
        finally:
            self._running = False

    async def _replace(self, old: WorkerHandle, reason: str) -> None:
        fresh = await self.supervisor.spawn(old.slot)
        # What the slot holds (forked by the same template as the old worker, the fresh
        # one shares the same copies).
        held = [route for route in self.dispatcher.routes.values() if old.slot in route.slots]
        results = await asyncio.gather(
            *(self.placement.load_on(fresh, route) for route in held), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors or not fresh.alive or not self._current(old):
            self.supervisor.kill(fresh, f"{fresh.describe()} of a recycle closed", crash=False)
            if errors:
                error = errors[0]
                self._failed(old, getattr(error, "message", str(error)))
            return
        self._take_over(old, fresh, held, reason)

    def _take_over(
        self, old: WorkerHandle, fresh: WorkerHandle, held: list[Route], reason: str
    ) -> None:
        """The fresh worker serves from now on: no await in here."""
        self.supervisor.take_over(old.slot, fresh)  # the old one retires: it drains
        for route in self.dispatcher.routes.values():
            if route not in held and old in route.ready:  # (none: its slot's routes are held)
                route.ready.remove(old)
        for route in held:
            if not self.dispatcher.current(route):  # unloaded or replaced meanwhile
                self.placement.unload_from([fresh], route.key, route.index)
                continue
            if old in route.ready:
                route.ready[route.ready.index(old)] = fresh
            else:
                route.ready.append(fresh)
            route.replica_back()
        self.counts[reason] += 1
        logger.info(
            "worker %d recycled (%s): pid %d took over, pid %d drains",
            old.slot, reason, fresh.pid, old.pid,
        )  # fmt: skip

    def _failed(self, old: WorkerHandle, reason: str) -> None:
        self._retry[old] = time.monotonic() + RETRY_AFTER
        logger.error(
            "cannot recycle %s (it keeps serving; tried again in %.0fs): %s",
            old.describe(), RETRY_AFTER, reason,
        )  # fmt: skip
