"""Supervision: the template process and the workers, kept running whatever happens.

``Supervisor`` starts the template process (``handles.TemplateProcess``) and has it fork
one worker per slot; it restarts the template when it dies (reaped, counted, backing
off), replaces a dead worker (backing off from a slot whose workers die soon after
starting, never giving up; ``outages.py`` keeps that bookkeeping and says when the
process is wedged), and every ``SUPERVISE_INTERVAL``:

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
from typing import Any, Protocol

from inferpool.engine.crashes import CrashBook, ExitStatuses, describe_exit
from inferpool.engine.handles import TemplateProcess, WorkerHandle
from inferpool.engine.ipc import messages
from inferpool.engine.ipc.messages import Reply
from inferpool.engine.outages import CRASH_WINDOW, MAX_BACKOFF, Outages
from inferpool.engine.repository import discover
from inferpool.errors import DeadlineExceeded, InferpoolError, NotReady, WorkerLost
from inferpool.protocol.limits import DecodeLimits
from inferpool.settings import ServerSettings

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
        self.count = settings.workers
        self.threads = max(1, (os.cpu_count() or 1) // self.count)
        self.max_queue = max(1, settings.max_queue)
        self.limits = DecodeLimits.from_settings(settings)
        self.workers: list[WorkerHandle | None] = [None] * self.count
        self.template: TemplateProcess | None = None
        # Readable by metrics and tests.
        self.template_restarts = 0
        self.worker_restarts = 0
        self.restarts_by_slot = [0] * self.count  # worker_restarts, per slot
        self.wedged: str | None = None  # why the process is not live, if it is not
        self.crashes = CrashBook()
        self.exits = ExitStatuses()
        self._tasks: set[asyncio.Future[Any]] = set()
        self.outages = Outages(self.count)
        self._template_up: asyncio.Event | None = None

    def keep(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` in the background until done or ``stop``."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def alive(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w is not None and w.alive]

    async def start(self) -> None:
        self._template_up = asyncio.Event()
        self._start_template()
        await asyncio.gather(*(self._spawn(slot) for slot in range(self.count)))
        self.keep(self._supervise())

    # -- the periodic checks -----------------------------------------------------------------
    async def _supervise(self) -> None:
        heartbeat = self.settings.worker_heartbeat_timeout
        ping_every = min(HEARTBEAT_INTERVAL, heartbeat / 4) if heartbeat > 0 else None
        pinged = time.monotonic()
        while not self.stopping():
            await asyncio.sleep(SUPERVISE_INTERVAL)
            now = time.monotonic()
            for worker in self.alive():
                self.check(worker, now)
            if ping_every is not None and now - pinged >= ping_every:
                pinged = now
                for worker in self.alive():
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

    # -- the template process ----------------------------------------------------------------
    def _start_template(self) -> None:
        self.template = TemplateProcess(self.threads, self.exits.reported, self._template_gone)
        repository = self.settings.model_repository
        with contextlib.suppress(FileNotFoundError):  # load_repository reports it
            found = discover(repository) if repository is not None else []
            self.template.preload([d.settings.model_dump(mode="json") for d in found if d.settings])
        self.outages.template_up(time.monotonic())
        assert self._template_up is not None
        self._template_up.set()

    def _template_gone(self, template: TemplateProcess) -> None:
        if template is not self.template:
            return
        self.template = None
        assert self._template_up is not None
        self._template_up.clear()
        if self.stopping():
            return
        self.outages.template_gone(time.monotonic())
        # Workers it had not forked yet never will be: their starts fail now, and retry.
        for worker in self.alive():
            if not worker.hello.done():
                self.worker_died(worker, "the worker template process exited")
        self.keep(self._restart_template(template))

    async def _restart_template(self, gone: TemplateProcess) -> None:
        status = await gone.reap()
        how = f"(pid {gone.process.pid}) {describe_exit(status)}"
        delay = self.outages.template_delay(time.monotonic())
        logger.error("the worker template process %s; restarting it in %.1fs", how, delay)
        while not self.stopping():
            await asyncio.sleep(delay)
            try:
                self._start_template()
            except OSError as exc:
                delay = min(MAX_BACKOFF, max(0.1, 2 * delay))
                logger.error(
                    "cannot restart the worker template process: %s; retrying in %.1fs",
                    exc, delay,
                )  # fmt: skip
                continue
            self.template_restarts += 1
            logger.info(
                "worker template process restarted (pid %d, restart %d)",
                self.template.process.pid if self.template else 0, self.template_restarts,
            )  # fmt: skip
            return

    # -- workers -----------------------------------------------------------------------------
    async def _spawn(self, slot: int) -> WorkerHandle:
        """Start a worker in ``slot``; NotReady or WorkerLost if it does not come up."""
        assert self._template_up is not None
        try:
            await asyncio.wait_for(self._template_up.wait(), SPAWN_TIMEOUT)
        except TimeoutError:
            raise NotReady("the worker template process is not running") from None
        worker = WorkerHandle(slot, self.max_queue)
        self.workers[slot] = worker
        template = self.template
        try:
            assert template is not None
            worker.ask_template(template.channel, self.threads, self.limits)
        except OSError as exc:
            worker.close(f"worker {slot} could not start")
            raise WorkerLost(f"cannot start worker {slot}: {exc}") from None
        worker.watch(self.worker_died)
        try:
            await asyncio.wait_for(asyncio.shield(worker.hello), SPAWN_TIMEOUT)
        except TimeoutError:
            worker.close(f"worker {slot} did not start")
            raise WorkerLost(f"worker {slot} did not start in {SPAWN_TIMEOUT:.0f}s") from None
        except InferpoolError:
            raise WorkerLost(f"worker {slot} exited while starting") from None
        logger.info("worker %d started (pid %d)", slot, worker.pid)
        worker.template = template
        self.outages.template_works()
        return worker

    def worker_died(self, worker: WorkerHandle, reason: str = "", crash: bool = True) -> None:
        """It is gone (or killed): answer what it held, blame its model, replace it."""
        if not worker.alive:
            return
        starting = not worker.hello.done()
        running = None if worker.closed else worker.requests.running()
        worker.drain_replies()  # answers it wrote before dying still count
        worker.close(reason or f"{worker.describe()} exited")
        if self.stopping() or starting:
            return  # a worker that never started: its _spawn fails and is retried
        logger.error("%s: %s; starting a replacement", worker.describe(), reason or "exited")
        self.events.worker_lost(worker)
        if worker.template is not self.template:
            # Its template died before it: it may be ours to reap now (as PID 1 it is).
            self.keep(self._reap_orphan(worker.pid))
        if crash and running is not None:
            self._blame(worker, running[0], running[1])
        # Back off from a slot whose workers die soon after starting, without a request to
        # blame (a request that kills workers is the quarantine's business, not a reason
        # to keep the other models waiting for a worker).
        quick = crash and running is None and time.monotonic() - worker.started_at < CRASH_WINDOW
        self.outages.worker_died(worker.slot, quick, time.monotonic())
        self.keep(self._replace(worker.slot))

    async def _replace(self, slot: int) -> None:
        """Start a worker in ``slot`` again, backing off while they keep dying; never give up."""
        attempt = 0
        while not self.stopping():
            delay = self.outages.worker_delay(slot, attempt)
            if delay >= 1:
                logger.warning("worker %d keeps failing; next start in %.1fs", slot, delay)
            await asyncio.sleep(delay)
            if self.stopping():
                return
            try:
                worker = await self._spawn(slot)
            except InferpoolError as exc:
                attempt += 1
                self.outages.worker_failed(slot, exc.message)
                logger.error("cannot start worker %d: %s", slot, exc.message)
                continue
            self.worker_restarts += 1
            self.restarts_by_slot[slot] += 1
            self.outages.worker_up(slot)
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
    def _blame(self, worker: WorkerHandle, model_index: int, request_ids: list[int]) -> None:
        """Count a crash against the model it was running, once its exit status is known."""
        if self.events.model_name(model_index) is None:
            return
        if self.template is not None:
            self.template.receive()  # its exit status may already be waiting
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
        for worker in self.alive():
            if worker.inflight:
                logger.warning(
                    "%s still runs requests at the end of the shutdown grace period; "
                    "killing it", worker.describe(),
                )  # fmt: skip
                self.kill(worker, f"{worker.describe()} was stopped at shutdown", crash=False)

    async def stop(self, deadline: float) -> None:
        """Drain, stop the workers and the template, all by ``deadline``."""
        while any(w.inflight for w in self.alive()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        exiting = []
        for worker in self.alive():
            with contextlib.suppress(OSError):
                worker.post_control(messages.Stop())
            exiting.append(worker.exited)
        if exiting:
            await asyncio.wait(exiting, timeout=max(0.5, deadline - time.monotonic()))
            for worker in self.alive():
                logger.warning("%s did not stop; killing it", worker.describe())
                self.kill(worker, f"{worker.describe()} was stopped", crash=False)
        for task in list(self._tasks):
            task.cancel()
        for handle in self.workers:  # any still starting
            if handle is not None:
                handle.close("the server is shutting down")
        template, self.template = self.template, None
        if template is not None:
            await template.stop(max(0.5, min(5.0, deadline - time.monotonic())))
