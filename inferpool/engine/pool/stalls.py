"""Stalls: a call that runs long must not starve the other models of its worker.

Every model has a replica on every worker, so a model whose ``predict`` hangs (or runs
long) holds each worker running one of its calls, and the other models' requests queue
behind it until the model's ``timeout`` kills the worker. ``Stalls`` reads the workers'
running records at every supervision tick (``PoolClient.tick``):

- a worker whose one group has run longer than ``stall_threshold`` is *stalled*: its
  replicas move from their routes' ``ready`` lists to their ``stalled`` ones (the
  dispatcher sends it nothing new), and the requests queued behind the long call move
  to a ready replica of their model (read back from its request ring, cancelled there);
- while a model that is not the stalling one has stalled replicas and none ready, a
  *standby worker* is forked by the stalled worker's template (sharing its copies, as
  any worker), loads the models the stalled workers hold except the stalling ones, and
  takes their requests. At most ``max_standby_workers`` run at once; past that bound, or
  when one cannot start, requests of a model without a ready replica queue behind the
  least-loaded stalled one (as without this module);
- a stalled worker whose call ends takes requests again; one whose call runs past its
  model's timeout is killed by the supervisor (504 for the call) and replaced in its
  slot, as before;
- once no worker has been stalled for ``STANDBY_LINGER`` seconds and every model a
  standby worker serves has another ready replica, the standby workers retire (they
  answer what they hold, then exit): the pool is back to its size.

A stalling model's own requests never go to a standby worker (a model that hangs on
every call would take each standby worker in turn): they go to its replicas that are not
stalled, else wait behind its long calls. Why standby workers rather than a group of
workers per model: docs/operate/containment.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.messages import HEADER
from inferpool.engine.ipc.ring import RUNNING_IDS
from inferpool.engine.pool.dispatch import Dispatcher, Route, send
from inferpool.engine.pool.handles import WorkerHandle
from inferpool.engine.pool.placement import Placement
from inferpool.engine.pool.supervisor import Supervisor
from inferpool.errors import InferpoolError
from inferpool.settings import ServerSettings

logger = logging.getLogger(__name__)

STANDBY_LINGER = 3.0  # seconds without a stall before standby workers retire
RETRY_AFTER = 1.0  # seconds before a standby worker that did not start is tried again


class Stalls:
    """Stalled workers, the requests moved off them, and the standby workers."""

    def __init__(
        self,
        settings: ServerSettings,
        supervisor: Supervisor,
        dispatcher: Dispatcher,
        placement: Placement,
    ) -> None:
        self.threshold_ns = int(settings.stall_threshold * 1e9)
        self.max_standby = settings.max_standby_workers
        self.supervisor = supervisor
        self.dispatcher = dispatcher
        self.placement = placement
        # Per stalled worker, the model index and start (monotonic ns) of its long group.
        self.stalled: dict[WorkerHandle, tuple[int, int]] = {}
        # Readable by metrics and tests.
        self.stalls = 0  # workers found stalled
        self.standby_started = 0
        self.moved = 0  # requests moved off stalled workers
        self._starting = False  # a standby worker is starting
        self._next_try = 0.0
        self._calm_since: float | None = None  # since when no worker is stalled
        self._bound_told = False

    def tick(self, now: float) -> None:
        """Follow the running records; move requests, start or retire standby workers."""
        if not self.threshold_ns or self.supervisor.stopping():
            return
        self._follow(time.monotonic_ns())
        if self.stalled:
            self._calm_since = None
            self._move_queued()
            self._add_standby(now)
        elif self.supervisor.standby:
            if self._calm_since is None:
                self._calm_since = now
            elif now - self._calm_since >= STANDBY_LINGER:
                self._retire_standby()

    # -- stalled workers ---------------------------------------------------------------------
    def _follow(self, now_ns: int) -> None:
        """Release the workers whose long group has ended, find those newly stalled."""
        for worker, (_, started) in list(self.stalled.items()):
            running = None if worker.closed else worker.requests.running()
            if running is None or running[2] != started or worker.retiring:
                self._release(worker, (now_ns - started) / 1e9)
        for worker in [*self.supervisor.alive(), *self.supervisor.standby]:
            if worker in self.stalled or not worker.alive or worker.retiring:
                continue
            running = worker.requests.running()
            if running is not None and now_ns - running[2] > self.threshold_ns:
                self._stall(worker, running[0], running[2], (now_ns - running[2]) / 1e9)

    def _stall(self, worker: WorkerHandle, model_index: int, started: int, seconds: float) -> None:
        self.stalled[worker] = (model_index, started)
        self.stalls += 1
        for route in self.dispatcher.routes.values():
            if worker in route.ready:
                route.ready.remove(worker)
                route.stalled.append(worker)
        running = self.dispatcher.route_of(model_index)
        logger.warning(
            "%s has run one call of %s for %.1fs (stall threshold %gs): it takes no new "
            "requests until that call ends; the other models' requests go to other workers",
            worker.describe(), running.describe() if running else "a model unloaded since",
            seconds, self.threshold_ns / 1e9,
        )  # fmt: skip

    def _release(self, worker: WorkerHandle, seconds: float) -> None:
        """The long group ended (or the worker is gone, or retiring): it serves again."""
        del self.stalled[worker]
        serving = worker.alive and not worker.retiring
        for route in self.dispatcher.routes.values():
            if worker in route.stalled:
                route.stalled.remove(worker)
                if serving:
                    route.ready.append(worker)
                    route.replica_back()
        if serving:
            logger.info("%s ended its long call after %.1fs; it takes requests again",
                        worker.describe(), seconds)  # fmt: skip

    # -- requests queued behind a long call --------------------------------------------------
    def _move_queued(self) -> None:
        for worker, (model_index, _) in list(self.stalled.items()):
            if worker.alive:
                self._move_from(worker, model_index)

    def _move_from(self, worker: WorkerHandle, stalling: int) -> None:
        """Send the requests ``worker`` holds and has not started to a ready replica of
        their model, and cancel them on ``worker`` (a worker drops a cancelled request it
        has not started; should it have started one already, its answer is dropped).

        Their bytes are read back from its request ring: a slot keeps them until it is
        written again, and the dispatcher writes no more to a stalled worker. A request
        too big for a slot (sent in its own memfd) cannot be read back: it waits."""
        running, group = worker.requests.running(), worker.requests.running_group()
        started = set(running[1]) if running is not None else set()
        # Its own model's requests move too (to its replicas that are not stalled), when
        # the record names every request of the running group.
        whole = group is not None and group[1] <= RUNNING_IDS
        held = {
            request_id
            for request_id, receiver in worker.inflight.items()
            # (a stream's sink is tied to its worker: streams stay)
            if request_id not in started and isinstance(receiver, asyncio.Future)
        }
        if not held:
            return
        for request_id, (fields, body) in worker.requests.find(held).items():
            route = self.dispatcher.route_of(fields[1])
            if route is None or not route.ready or (fields[1] == stalling and not whole):
                continue
            target = self.dispatcher.pick(route)
            receiver = worker.inflight.get(request_id)
            if target is None or target is worker or receiver is None or receiver.done():
                continue
            try:
                send(target, HEADER.pack(*fields), body)
            except OSError:
                continue  # it died; its EOF is handled next
            target.inflight[request_id] = worker.inflight.pop(request_id)
            self.moved += 1
            with contextlib.suppress(OSError):  # it died: nothing to cancel
                worker.post_control(messages.Cancel(request_id=request_id))

    # -- standby workers ---------------------------------------------------------------------
    def _add_standby(self, now: float) -> None:
        """Fork a standby worker if a model that is not stalling has stalled replicas and
        no ready one (and the bound allows)."""
        stalling = {model_index for model_index, _ in self.stalled.values()}
        routes = self.dispatcher.routes.values()
        needy = [r for r in routes if r.stalled and not r.ready and r.index not in stalling]
        if not needy or self._starting or now < self._next_try:
            return
        if len(self.supervisor.standby) >= self.max_standby:
            if not self._bound_told:
                self._bound_told = True
                logger.warning(
                    "%s has no ready replica and %d standby worker(s) run already "
                    "(--max-standby-workers): its requests wait behind the stalled workers",
                    needy[0].describe(), len(self.supervisor.standby),
                )  # fmt: skip
            return
        self._bound_told = False
        slot = needy[0].stalled[0].slot
        wanted = [
            route
            for route in routes
            if route.stalled
            and route.index not in stalling
            and slot in self.supervisor.roster.eligible_slots(route.settings)
        ]
        for route in wanted:
            route.standby_coming = True  # its requests wait for the standby worker
        self._starting = True
        self.supervisor.keep(self._start_standby(slot, wanted))

    async def _start_standby(self, slot: int, routes: list[Route]) -> None:
        try:
            worker = await self.supervisor.spawn(slot)
        except InferpoolError as exc:
            logger.error("cannot start a standby worker: %s", exc.message)
            self._next_try = time.monotonic() + RETRY_AFTER
            self._done_starting(routes)
            return
        self.supervisor.spares.discard(worker)
        worker.standby = True
        self.supervisor.standby.add(worker)
        self.standby_started += 1
        try:
            results = await asyncio.gather(
                *(self.placement.load_on(worker, route) for route in routes),
                return_exceptions=True,
            )
            served = []
            for route, result in zip(routes, results, strict=True):
                if isinstance(result, BaseException):
                    reason = getattr(result, "message", str(result))
                    logger.error("%s could not load %s: %s",
                                 worker.describe(), route.describe(), reason)  # fmt: skip
                elif self.dispatcher.replica_ready(route, worker):
                    served.append(route.describe())
            logger.warning(
                "%s started while workers %s are stalled; it serves %s",
                worker.describe(), sorted(w.slot for w in self.stalled), ", ".join(served),
            )  # fmt: skip
        finally:
            self._done_starting(routes)
        self._move_queued()

    def _done_starting(self, routes: list[Route]) -> None:
        """The standby worker is up (or not): requests that waited for it go on."""
        self._starting = False
        for route in routes:
            route.standby_coming = False
            route.wake()

    def _retire_standby(self) -> None:
        """Retire the standby workers whose models have another ready replica again."""
        for worker in list(self.supervisor.standby):
            serves = [route for route in self.dispatcher.routes.values() if worker in route.ready]
            if any(len(route.ready) == 1 for route in serves):
                continue  # a replacement in a slot has not loaded that model yet
            for route in serves:
                route.ready.remove(worker)
            self.supervisor.standby.discard(worker)
            logger.info("%s retires: no worker is stalled now", worker.describe())
            self.supervisor.retire(worker)
