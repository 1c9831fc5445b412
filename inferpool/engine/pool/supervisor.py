"""Supervision: the template process and the workers, kept running whatever happens.

``Supervisor`` has the template process (``template_keeper.py``: started, preloaded,
restarted) fork one worker per slot once the repository's models are loaded, replaces a
dead worker (backing off from a slot whose workers die soon after
starting, never giving up; ``outages.py`` keeps that bookkeeping and says when the
process is wedged: no worker or template for ``WEDGED_AFTER``), retires the workers a new
generation replaced (``retire``: they finish what they hold, then exit; not a crash, not
replaced), and has ``watchdog.py`` recycle the workers past their model's timeout and
kill the silent ones. The worker groups, and those started for an environment, are
``roster.py``'s; it asks for their slots, template and first workers (``SlotHost``).

A crash is blamed on the model the worker was running (``crash_blame.py``) once the
template reports its exit status. At shutdown it drains, stops and kills by one
deadline. It talks to the pool through ``PoolEvents``: "this worker is lost", "this one
replaced it: reload its models", "quarantine this model".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.call_ops import Call
from inferpool.engine.pool.crash_blame import CrashBlame
from inferpool.engine.pool.groups import WorkerGroup
from inferpool.engine.pool.handles import Answer, WorkerHandle
from inferpool.engine.pool.outages import CRASH_WINDOW, Outages
from inferpool.engine.pool.roster import GroupRoster, shared_preloads, shared_slots
from inferpool.engine.pool.template_keeper import TemplateKeeper
from inferpool.engine.pool.template_process import TemplateProcess
from inferpool.engine.pool.watchdog import Watchdog
from inferpool.errors import InferpoolError, NotReady, WorkerLost
from inferpool.protocol.limits import DecodeLimits
from inferpool.settings import ServerSettings

logger = logging.getLogger(__name__)

SPAWN_TIMEOUT = 60.0


class PoolEvents(Protocol):
    """What the supervisor tells the pool, and asks it."""

    def timeout_of(self, model_index: int) -> float:
        """The timeout of the model under this index (0: none)."""

    def model_name(self, model_index: int) -> str | None:
        """The model served under this index, None once unloaded or replaced."""

    def worker_lost(self, worker: WorkerHandle) -> None:
        """``worker`` is gone: its replicas take no more requests."""

    def worker_replaced(self, worker: WorkerHandle) -> Awaitable[None]:
        """``worker`` took a dead one's slot: load the models that slot held."""

    def serve_call(self, worker: WorkerHandle, message: Call, answer: Answer) -> None:
        """Run a runtime's call to another model; ``answer`` its ``CallReply``."""

    def shared_documents(self) -> list[dict[str, Any]]:
        """The settings (as JSON) of the model versions served now: a restarted template
        preloads them."""

    @property
    def started(self) -> bool:
        """Start-up (the repository's first load) has finished."""

    def quarantine(self, model_index: int, reason: str) -> None:
        """The model under this index keeps crashing workers."""

    def tick(self, now: float) -> None:
        """Called every ``watchdog.SUPERVISE_INTERVAL``."""


class Supervisor:
    """The template process, the workers, their health and their replacement."""

    def __init__(
        self, settings: ServerSettings, events: PoolEvents, stopping: Callable[[], bool]
    ) -> None:
        self.settings = settings
        self.events = events
        self.stopping = stopping
        # The slots the server's own template forks: the default group's, then those of
        # the configured groups without an environment. Other groups' slots come after.
        self.count = shared_slots(settings)
        # 0 slots of its own: --workers 0's pool of environment groups (environment_workers.py).
        self.threads = max(1, (os.cpu_count() or 1) // max(1, self.count))
        self.max_queue = max(1, settings.max_queue)
        self.limits = DecodeLimits.from_settings(settings)
        # Bytes each worker may map beyond its start (worker/memory_limit.py).
        self.memory_limit = max(0, settings.worker_memory_limit) * 1024 * 1024
        self.workers: list[WorkerHandle | None] = [None] * self.count
        self.retiring: set[WorkerHandle] = set()  # replaced by a new generation, exiting
        self.spares: set[WorkerHandle] = set()  # started for a new generation, not serving
        self.standby: set[WorkerHandle] = set()  # forked while workers stall (stalls.py)
        self._starting: set[WorkerHandle] = set()  # asked of the template, not up yet
        # Per slot, how many new generations took it over: a replacement started before
        # one did must not take the slot back.
        self.rolls_by_slot = [0] * self.count
        # Readable by metrics and tests.
        self.worker_restarts = 0
        self.restarts_by_slot = [0] * self.count  # worker_restarts, per slot
        self.timeout_kills = 0  # workers killed because a call ran past its model's timeout
        self.wedged: str | None = None  # why the process is not live, if it is not
        self._tasks: set[asyncio.Future[Any]] = set()
        self.blame = CrashBlame(events, self.keep, lambda w: self.group_of(w.slot).keeper.template)
        self.outages = Outages(self.count)
        self.templates = TemplateKeeper(
            self.blame.exits, self.outages, events, stopping, self.keep,
            gone=lambda: self._template_gone(self.templates),
            load_timeout=settings.model_load_timeout,
        )  # fmt: skip
        self.roster = GroupRoster(settings, self.templates, self.outages, self)
        self.group_of = self.roster.group_of
        self.watchdog = Watchdog(self)

    @property
    def template(self) -> TemplateProcess | None:
        """The template process running now, if one is."""
        return self.templates.template

    @property
    def template_restarts(self) -> int:
        return self.templates.restarts

    def keep(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` in the background until done or ``stop``."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def alive(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w is not None and w.alive]

    def supervised(self) -> list[WorkerHandle]:
        """The live workers, current, retiring, spare and standby: their timeouts and
        heartbeats are watched, and shutdown stops them all."""
        others = (*self.retiring, *self.spares, *self.standby)
        return [*self.alive(), *(w for w in others if w.alive)]

    async def start(self) -> None:
        if self.count:  # else no worker of the server's own: no template of its own
            self.templates.start(shared_preloads(self.settings))
        await asyncio.gather(*(self._spawn(slot, installs=0) for slot in range(self.count)))
        await self.roster.start_configured()
        self.keep(self.watchdog.run())

    # -- a worker group's slots (SlotHost) ---------------------------------------------------
    def open_slots(self, count: int) -> range:
        base = len(self.workers)
        self.workers.extend([None] * count)
        self.rolls_by_slot.extend([0] * count)
        self.restarts_by_slot.extend([0] * count)
        return range(base, base + count)

    def keeper_for(self, outages: Outages, python: Path) -> TemplateKeeper:
        keeper = TemplateKeeper(
            self.blame.exits, outages, _NOTHING_SHARED, self.stopping, self.keep,
            gone=lambda: self._template_gone(keeper), python=python,
        )  # fmt: skip
        return keeper

    async def fill(self, group: WorkerGroup) -> None:
        slots = group.slots
        started = await asyncio.gather(
            *(self._spawn(slot, installs=0) for slot in slots), return_exceptions=True
        )
        for slot, result in zip(slots, started, strict=True):
            if isinstance(result, BaseException):
                reason = getattr(result, "message", str(result))
                logger.error("%s: worker %d did not start: %s", group.name, slot, reason)
                group.outages.worker_died(slot, False, time.monotonic())
                self.keep(self._replace(slot))

    # -- workers -----------------------------------------------------------------------------
    def kill(self, worker: WorkerHandle, reason: str, crash: bool) -> None:
        if worker.pid:
            with contextlib.suppress(OSError):
                os.kill(worker.pid, signal.SIGKILL)
        self.worker_died(worker, reason, crash=crash)

    def _template_gone(self, keeper: TemplateKeeper) -> None:
        """Workers the template had not forked yet never will be: their starts fail now,
        and retry."""
        for worker in list(self._starting):
            if self.group_of(worker.slot).keeper is keeper:
                self.worker_died(worker, "the worker template process exited")

    async def spawn(self, slot: int) -> WorkerHandle:
        """Start a worker for ``slot`` without giving it the slot (a new generation's);
        NotReady or WorkerLost if it does not come up."""
        spare = await self._spawn(slot, None)
        self.spares.add(spare)
        return spare

    async def _spawn(self, slot: int, installs: int | None) -> WorkerHandle:
        """Start a worker in ``slot``; NotReady or WorkerLost if it does not come up.

        It takes the slot unless ``installs`` is None, or is not the slot's count of
        rolls any more (a new generation took the slot over meanwhile: Superseded).
        """
        group = self.group_of(slot)
        template = await group.keeper.running()
        worker = WorkerHandle(slot, self.max_queue)
        worker.on_call = self.events.serve_call
        if installs is not None:
            if installs != self.rolls_by_slot[slot]:
                worker.close("superseded")
                raise Superseded(f"worker {slot} was replaced by a new generation")
            self.workers[slot] = worker
        try:
            worker.ask_template(template.channel, self.threads, self.limits, self.memory_limit)
        except OSError as exc:
            worker.close(f"worker {slot} could not start")
            raise WorkerLost(f"cannot start worker {slot}: {exc}") from None
        worker.watch(self.worker_died)
        self._starting.add(worker)
        try:
            await asyncio.wait_for(asyncio.shield(worker.hello), SPAWN_TIMEOUT)
        except TimeoutError:
            worker.close(f"worker {slot} did not start")
            raise WorkerLost(f"worker {slot} did not start in {SPAWN_TIMEOUT:.0f}s") from None
        except InferpoolError:
            raise WorkerLost(f"worker {slot} exited while starting") from None
        finally:
            self._starting.discard(worker)
        logger.info("worker %d started (pid %d)", slot, worker.pid)
        worker.template = template
        group.outages.template_works()
        return worker

    def worker_died(self, worker: WorkerHandle, reason: str = "", crash: bool = True) -> None:
        """It is gone (or killed): answer what it held, blame its model, replace it."""
        if not worker.alive:
            return
        starting = not worker.hello.done()
        running = None if worker.closed else worker.requests.running()
        worker.drain_replies()  # answers it wrote before dying still count
        held = len(worker.inflight)  # those it did not answer: close fails them (503)
        worker.close(reason or f"{worker.describe()} exited")
        if worker is not self.workers[worker.slot]:
            self._gone_from_outside(worker, running, held, crash)
            return
        if self.stopping() or starting:
            return  # a worker that never started: its _spawn fails and is retried
        logger.error("%s: %s; starting a replacement", worker.describe(), reason or "exited")
        self.events.worker_lost(worker)
        group = self.group_of(worker.slot)
        if worker.template is not group.keeper.template:
            # Its template died before it: it may be ours to reap now (as PID 1 it is).
            self.keep(self.blame.reap_orphan(worker.pid))
        if crash and running is not None:
            self.blame.blame(worker, running[0], running[1])
        # Back off from a slot whose workers die soon after starting, without a request to
        # blame (a request that kills workers is the quarantine's business, not a reason
        # to keep the other models waiting for a worker).
        quick = crash and running is None and time.monotonic() - worker.started_at < CRASH_WINDOW
        group.outages.worker_died(worker.slot, quick, time.monotonic())
        self.keep(self._replace(worker.slot))

    def _gone_from_outside(
        self,
        worker: WorkerHandle,
        running: tuple[int, list[int], int] | None,
        failed: int,
        crash: bool,
    ) -> None:
        """A worker that holds no slot is gone: a retiring one, or one of a new generation
        that did not take over (its roll fails). Not replaced, not counted as a restart."""
        self.retiring.discard(worker)
        self.spares.discard(worker)
        self.standby.discard(worker)
        self.events.worker_lost(worker)  # a standby worker serves replicas until it is gone
        if self.stopping() or not worker.hello.done():
            return
        if worker.template is not self.group_of(worker.slot).keeper.template:
            self.keep(self.blame.reap_orphan(worker.pid))
        if crash and running is not None:
            self.blame.blame(worker, running[0], running[1])
        if not worker.retiring:
            if crash:  # else closed because its generation did not take over
                what = "" if worker.standby else " of a new generation"
                logger.warning("%s%s exited", worker.describe(), what)
        elif failed:
            logger.error("%s exited with %d request(s) unanswered", worker.describe(), failed)
        else:
            logger.info("%s has drained and exited", worker.describe())

    def retire(self, worker: WorkerHandle) -> None:
        """A new generation took over from ``worker``: it answers what it holds, then
        exits; it is killed if it has not within the shutdown timeout."""
        worker.retiring = True
        if not worker.alive:
            return
        self.retiring.add(worker)
        with contextlib.suppress(OSError):  # it died meanwhile: its EOF says so
            worker.post_control(messages.Stop())
        self.keep(self._kill_unless_exited(worker, self.settings.shutdown_timeout))

    async def _kill_unless_exited(self, worker: WorkerHandle, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(worker.exited), max(0.5, timeout))
            return
        logger.warning("%s did not exit %.0fs after it was replaced; killing it",
                       worker.describe(), timeout)  # fmt: skip
        self.kill(worker, f"{worker.describe()} did not exit after it was replaced", crash=False)

    def take_over(self, slot: int, worker: WorkerHandle) -> WorkerHandle | None:
        """A new generation's ``worker`` takes ``slot``; the one it replaces, retiring."""
        old, self.workers[slot] = self.workers[slot], worker
        self.spares.discard(worker)
        self.rolls_by_slot[slot] += 1
        self.group_of(slot).outages.worker_up(slot)  # a replacement under way gives up
        if old is not None:
            self.retire(old)
        return old

    async def _replace(self, slot: int) -> None:
        """Start a worker in ``slot`` again, backing off while they keep dying; never give up."""
        attempt = 0
        rolls = self.rolls_by_slot[slot]
        outages = self.group_of(slot).outages
        while not self.stopping() and rolls == self.rolls_by_slot[slot]:
            delay = outages.worker_delay(slot, attempt)
            if delay >= 1:
                logger.warning("worker %d keeps failing; next start in %.1fs", slot, delay)
            await asyncio.sleep(delay)
            if self.stopping():
                return
            try:
                worker = await self._spawn(slot, rolls)
            except Superseded:
                return
            except InferpoolError as exc:
                attempt += 1
                outages.worker_failed(slot, exc.message)
                logger.error("cannot start worker %d: %s", slot, exc.message)
                continue
            self.worker_restarts += 1
            self.restarts_by_slot[slot] += 1
            outages.worker_up(slot)
            if not worker.retiring:  # a new generation took over the slot meanwhile
                await self.events.worker_replaced(worker)
            return

    # -- shutdown ----------------------------------------------------------------------------
    async def stop(self, deadline: float) -> None:
        """Drain, stop the workers and the template, all by ``deadline``."""
        while any(w.inflight for w in self.supervised()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        exiting = []
        for worker in self.supervised():
            with contextlib.suppress(OSError):
                worker.post_control(messages.Stop())
            exiting.append(worker.exited)
        if exiting:
            await asyncio.wait(exiting, timeout=max(0.5, deadline - time.monotonic()))
            for worker in self.supervised():
                logger.warning("%s did not stop; killing it", worker.describe())
                self.kill(worker, f"{worker.describe()} was stopped", crash=False)
        for task in list(self._tasks):
            task.cancel()
        for handle in [*self.workers, *self._starting]:  # any still starting
            if handle is not None:
                handle.close("the server is shutting down")
        keepers = {id(group.keeper): group.keeper for group in self.roster.groups}.values()
        wait = max(0.5, min(5.0, deadline - time.monotonic()))
        await asyncio.gather(*(keeper.stop(wait) for keeper in keepers))


class _NothingShared:
    """What an environment's template preloads when it restarts: nothing (each of its
    workers loads its own models)."""

    started = True

    def shared_documents(self) -> list[dict[str, Any]]:
        return []


_NOTHING_SHARED = _NothingShared()


class Superseded(NotReady):
    """A replacement was not started: a new generation of workers took the slot over."""
