"""Supervision: the template process and the workers, kept running whatever happens.

``Supervisor`` has the template process (``template_keeper.py``: started, preloaded,
restarted) fork one worker per slot once the repository's models are loaded, replaces a
dead worker (backing off from a slot whose workers die soon after
starting, never giving up; ``outages.py`` keeps that bookkeeping and says when the
process is wedged), retires the workers a new generation replaced (``retire``: they
finish what they hold, then exit; not a crash, not replaced), and every
``SUPERVISE_INTERVAL``, for current and retiring workers alike:

- recycles a worker whose group runs past its model's timeout (504 for the group);
- kills a worker silent for ``worker_heartbeat_timeout`` (any message or reply counts as
  a sign of life; workers answer pings between requests);
- tells whether the process is wedged (no worker or template for ``WEDGED_AFTER``).

A crash is blamed on the model the worker was running (``crashes.py``) once the
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
from typing import TYPE_CHECKING, Any, Protocol

from inferpool.engine.environments.capabilities import Capabilities
from inferpool.engine.environments.interpreters import ProbeFailed, probe
from inferpool.engine.ipc import messages
from inferpool.engine.ipc.messages import Reply
from inferpool.engine.pool.crashes import CrashBook, ExitStatuses
from inferpool.engine.pool.groups import (
    WorkerGroup,
    eligible,
    names_environment,
    refusal,
    runtime_library,
)
from inferpool.engine.pool.handles import TemplateProcess, WorkerHandle
from inferpool.engine.pool.outages import CRASH_WINDOW, Outages
from inferpool.engine.pool.template_keeper import TemplateKeeper
from inferpool.engine.repository import discover
from inferpool.errors import DeadlineExceeded, InferpoolError, ModelLoadError, NotReady, WorkerLost
from inferpool.protocol.limits import DecodeLimits
from inferpool.settings import ModelSettings, ServerSettings

if TYPE_CHECKING:
    from inferpool.engine.environments.unpack import Environment

logger = logging.getLogger(__name__)

SPAWN_TIMEOUT = 60.0
HEARTBEAT_INTERVAL = 5.0
SUPERVISE_INTERVAL = 0.25  # how often running groups are checked against their timeout
EXIT_STATUS_WAIT = 1.0  # how long a crash report waits for the template's exit status
KILL_MARGIN = 0.5  # at shutdown, hung workers die this long before the grace period ends


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

    def shared_documents(self) -> list[dict[str, Any]]:
        """The settings (as JSON) of the model versions served now: a restarted template
        preloads them."""

    @property
    def started(self) -> bool:
        """Start-up (the repository's first load) has finished."""

    def quarantine(self, model_index: int, reason: str) -> None:
        """The model under this index keeps crashing workers."""

    def tick(self, now: float) -> None:
        """Called every ``SUPERVISE_INTERVAL``."""


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
        plain = [group for group in settings.worker_groups if group.environment is None]
        self.count = settings.workers + sum(group.workers for group in plain)
        self.threads = max(1, (os.cpu_count() or 1) // self.count)
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
        self.crashes = CrashBook()
        self.exits = ExitStatuses()
        self._tasks: set[asyncio.Future[Any]] = set()
        self.outages = Outages(self.count)
        self.templates = TemplateKeeper(
            self.exits, self.outages, events, stopping, self.keep,
            gone=lambda: self._template_gone(self.templates),
            load_timeout=settings.model_load_timeout,
        )  # fmt: skip
        self.groups = [
            WorkerGroup("default", range(settings.workers), self.templates, self.outages,
                        tuple(settings.worker_tags)),
        ]  # fmt: skip
        for group in plain:
            base = self.groups[-1].slots.stop
            slots = range(base, base + group.workers)
            self.groups.append(
                WorkerGroup(group.name, slots, self.templates, self.outages, tuple(group.tags))
            )
        # Groups running an environment, by its key; and the key of each environment a
        # model named (by the path it named), as last prepared.
        self.environments: dict[str, WorkerGroup] = {}
        self.named: dict[str, str] = {}
        self._adding: dict[str, asyncio.Future[WorkerGroup]] = {}

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

    def group_of(self, slot: int) -> WorkerGroup:
        for group in self.groups:
            if slot in group.slots:
                return group
        raise KeyError(slot)

    def environment_key(self, settings: ModelSettings) -> str | None:
        """The key of the environment the model names, once ``group_for`` prepared it."""
        from inferpool.engine.environments.unpack import named_environment

        named = named_environment(settings, self.settings.environment_tarball)
        return None if named is None else self.named.get(str(named))

    def eligible(
        self, settings: ModelSettings, workers: list[WorkerHandle]
    ) -> tuple[list[WorkerHandle], dict[str, int]]:
        """``groups.eligible``: the workers that may hold the model, the others by why not."""
        return eligible(settings, self.environment_key(settings), workers, self.group_of)

    def eligible_slots(self, settings: ModelSettings) -> set[int]:
        """Every slot, live or not, whose group may hold the model."""
        environment, requirements = self.environment_key(settings), settings.requirements
        library = runtime_library(settings)
        return {
            slot
            for group in self.groups
            if refusal(group, environment, requirements, library) is None
            for slot in group.slots
        }

    async def group_for(self, settings: ModelSettings) -> WorkerGroup | None:
        """The group running the environment the model names (started now if none does);
        None if it names none. ModelLoadError if the environment cannot be used."""
        from inferpool.engine.environments.unpack import default_cache, named_environment, prepare

        named = named_environment(settings, self.settings.environment_tarball)
        if named is None:
            return None
        cache = self.settings.environments_dir or default_cache()
        try:
            environment = await asyncio.to_thread(prepare, named, cache)
        except InferpoolError as exc:
            raise ModelLoadError(exc.message) from None
        self.named[str(named)] = environment.key
        group = self.environments.get(environment.key)
        if group is not None:
            return group
        adding = self._adding.get(environment.key)
        if adding is None:
            name = f"env-{environment.key[:8]}"
            workers = self.settings.environment_workers
            adding = asyncio.ensure_future(self.add_group(name, environment, workers, []))
            self._adding[environment.key] = adding
            adding.add_done_callback(lambda _: self._adding.pop(environment.key, None))
        return await asyncio.shield(adding)

    async def add_group(
        self, name: str, environment: Environment, workers: int, tags: list[str]
    ) -> WorkerGroup:
        """Start ``workers`` workers with ``environment``'s interpreter, under a template
        of their own; ModelLoadError if the interpreter cannot run them."""
        try:
            found = await asyncio.to_thread(probe, environment.python)
        except ProbeFailed as exc:
            raise ModelLoadError(f"environment {environment.source}: {exc}") from None
        probed = Capabilities.from_dict(found)
        base = len(self.workers)
        slots = range(base, base + workers)
        self.workers.extend([None] * workers)
        self.rolls_by_slot.extend([0] * workers)
        self.restarts_by_slot.extend([0] * workers)
        outages = Outages(slots.stop)
        keeper = TemplateKeeper(
            self.exits, outages, _NOTHING_SHARED, self.stopping, self.keep,
            gone=lambda: self._template_gone(keeper), python=environment.python,
        )  # fmt: skip
        group = WorkerGroup(name, slots, keeper, outages, tuple(tags), environment, probed)
        self.groups.append(group)
        self.environments[environment.key] = group
        logger.info("starting %s", group.describe())
        keeper.start([])
        started = await asyncio.gather(
            *(self._spawn(slot, installs=0) for slot in slots), return_exceptions=True
        )
        for slot, result in zip(slots, started, strict=True):
            if isinstance(result, BaseException):
                reason = getattr(result, "message", str(result))
                logger.error("%s: worker %d did not start: %s", group.name, slot, reason)
                outages.worker_died(slot, False, time.monotonic())
                self.keep(self._replace(slot))
        return group

    def alive(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w is not None and w.alive]

    def supervised(self) -> list[WorkerHandle]:
        """The live workers, current, retiring, spare and standby: their timeouts and
        heartbeats are watched, and shutdown stops them all."""
        others = (*self.retiring, *self.spares, *self.standby)
        return [*self.alive(), *(w for w in others if w.alive)]

    async def start(self) -> None:
        repository = self.settings.model_repository
        found = []
        with contextlib.suppress(FileNotFoundError):  # load_repository reports it
            found = discover(repository) if repository is not None else []
        documents = [d.settings.model_dump(mode="json") for d in found if d.settings]
        # A model with an environment of its own is never loaded by the server's template.
        server = self.settings.environment_tarball
        self.templates.start([d for d in documents if not names_environment(d, server)])
        await asyncio.gather(*(self._spawn(slot, installs=0) for slot in range(self.count)))
        for group in self.settings.worker_groups:
            if group.environment is not None:
                await self._start_configured(group.name, group.environment, group.workers,
                                             group.tags)  # fmt: skip
        self.keep(self._supervise())

    async def _start_configured(self, name: str, named: str, workers: int, tags: list[str]) -> None:
        """A configured group with an environment; one that cannot start is logged (the
        models that need it fail to load, saying why)."""
        from inferpool.engine.environments.unpack import default_cache, prepare

        cache = self.settings.environments_dir or default_cache()
        try:
            environment = await asyncio.to_thread(prepare, Path(named), cache)
            self.named[str(Path(named))] = environment.key
            if environment.key not in self.environments:
                await self.add_group(name, environment, workers, tags)
        except InferpoolError as exc:
            logger.error("worker group '%s' cannot start: %s", name, exc.message)

    # -- the periodic checks -----------------------------------------------------------------
    async def _supervise(self) -> None:
        heartbeat = self.settings.worker_heartbeat_timeout
        ping_every = min(HEARTBEAT_INTERVAL, heartbeat / 4) if heartbeat > 0 else None
        pinged = time.monotonic()
        while not self.stopping():
            await asyncio.sleep(SUPERVISE_INTERVAL)
            now = time.monotonic()
            for worker in self.supervised():
                self.check(worker, now)
            if ping_every is not None and now - pinged >= ping_every:
                pinged = now
                for worker in self.supervised():
                    with contextlib.suppress(OSError):
                        worker.post_control(messages.Ping())
            self.check_wedged(now)
            self.events.tick(now)

    def check(self, worker: WorkerHandle, now: float) -> None:
        """Recycle ``worker`` past its model's timeout, kill it if it is hung."""
        running = worker.requests.running()
        if running is not None and self._past_timeout(worker, running, now):
            return
        heartbeat = self.settings.worker_heartbeat_timeout
        if worker.loading is not None and now - worker.loading_since > heartbeat > 0:
            worker.hung = round(now - worker.loading_since)  # its model is blamed as hung
        if heartbeat > 0 and now - worker.last_seen > heartbeat:
            if running is not None and self.events.timeout_of(running[0]) > 0:
                return  # busy with a group its model's timeout still allows
            logger.error("%s answered nothing for %.0fs; killing it", worker.describe(), heartbeat)
            self.kill(worker, f"{worker.describe()} exited", crash=False)

    def _past_timeout(
        self, worker: WorkerHandle, running: tuple[int, list[int], int], now: float
    ) -> bool:
        """Recycle ``worker`` if its group runs past its model's timeout: 504 for the group."""
        model_index, request_ids, started_ns = running
        timeout = self.events.timeout_of(model_index)
        if not timeout or now - started_ns / 1e9 <= timeout:
            return False
        name = self.events.model_name(model_index) or f"#{model_index}"
        message = (
            f"model '{name}' ran longer than its timeout ({timeout:g} s); "
            f"{worker.describe()} was recycled"
        )
        logger.error("%s", message)
        self.timeout_kills += 1
        late = Reply.from_error(DeadlineExceeded(message))
        for request_id in request_ids:
            future = worker.inflight.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(late)
        self.kill(worker, f"{worker.describe()} was recycled ({message})", crash=False)
        return True

    def kill(self, worker: WorkerHandle, reason: str, crash: bool) -> None:
        if worker.pid:
            with contextlib.suppress(OSError):
                os.kill(worker.pid, signal.SIGKILL)
        self.worker_died(worker, reason, crash=crash)

    def check_wedged(self, now: float) -> None:
        wedged = self.outages.wedged(now, self.template is not None)
        if wedged and wedged != self.wedged:
            logger.error("not live: %s", wedged)
        self.wedged = wedged

    def _template_gone(self, keeper: TemplateKeeper) -> None:
        """Workers the template had not forked yet never will be: their starts fail now,
        and retry."""
        for worker in list(self._starting):
            if self.group_of(worker.slot).keeper is keeper:
                self.worker_died(worker, "the worker template process exited")

    # -- workers -----------------------------------------------------------------------------
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
            self.keep(self._reap_orphan(worker.pid))
        if crash and running is not None:
            self._blame(worker, running[0], running[1])
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
            self.keep(self._reap_orphan(worker.pid))
        if crash and running is not None:
            self._blame(worker, running[0], running[1])
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

    async def _reap_orphan(self, pid: int) -> None:
        for _ in range(40):  # its channel closes a moment before it can be reaped
            try:
                reaped, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return  # not our child: init reaps it
            if reaped:
                self.exits.reported(pid, status)
                return
            await asyncio.sleep(0.05)

    # -- crash blame -------------------------------------------------------------------------
    async def exit_status(self, worker: WorkerHandle) -> int | None:
        """How ``worker`` ended (a waitpid status, reported by its template), None if that is
        not known within ``EXIT_STATUS_WAIT``."""
        template = self.group_of(worker.slot).keeper.template
        if template is not None:
            template.receive()  # its exit status may already be waiting
        status = self.exits.take(worker.pid)
        return status if status is not None else await self.exits.wait(worker.pid, EXIT_STATUS_WAIT)

    def _blame(self, worker: WorkerHandle, model_index: int, request_ids: list[int]) -> None:
        """Count a crash against the model it was running, once its exit status is known."""
        if self.events.model_name(model_index) is None:
            return
        template = self.group_of(worker.slot).keeper.template
        if template is not None:
            template.receive()  # its exit status may already be waiting
        status = self.exits.take(worker.pid)
        if status is not None:
            self.count_crash(worker, model_index, request_ids, status)
        else:
            self.keep(self._blame_when_reaped(worker, model_index, request_ids))

    async def _blame_when_reaped(
        self, worker: WorkerHandle, model_index: int, request_ids: list[int]
    ) -> None:
        status = await self.exits.wait(worker.pid, EXIT_STATUS_WAIT)
        if status is None:
            logger.warning("no exit status for %s; its crash is not counted", worker.describe())
        elif self.events.model_name(model_index) is not None:  # not unloaded or replaced
            self.count_crash(worker, model_index, request_ids, status)

    def count_crash(
        self, worker: WorkerHandle, model_index: int, request_ids: list[int], status: int
    ) -> None:
        """Quarantine a model whose requests keep killing workers."""
        name = self.events.model_name(model_index) or f"#{model_index}"
        now = time.monotonic()
        reason = self.crashes.count(worker.describe(), name, request_ids, status, now)
        if reason is not None:
            self.events.quarantine(model_index, reason)

    # -- shutdown ----------------------------------------------------------------------------
    def arm_deadline(self, deadline: float) -> None:
        """Shutdown began: workers still hung near ``deadline`` are killed."""
        with contextlib.suppress(RuntimeError):  # no loop: nothing runs to be killed
            asyncio.get_running_loop()
            self.keep(self._kill_hung_at(deadline))

    async def _kill_hung_at(self, deadline: float) -> None:
        """Shortly before the grace period ends, kill workers still holding requests.

        Their requests are answered 503 in time for the frontends to write them out, so
        a hung predict never stretches shutdown past ``shutdown_timeout``.
        """
        await asyncio.sleep(max(0.0, deadline - KILL_MARGIN - time.monotonic()))
        for worker in self.supervised():
            if worker.inflight:
                logger.warning(
                    "%s still runs requests at the end of the shutdown grace period; "
                    "killing it", worker.describe(),
                )  # fmt: skip
                self.kill(worker, f"{worker.describe()} was stopped at shutdown", crash=False)

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
        keepers = {id(group.keeper): group.keeper for group in self.groups}.values()
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
