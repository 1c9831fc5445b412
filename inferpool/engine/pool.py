"""The worker pool: spawn workers, dispatch requests to them, survive their deaths.

``PoolClient`` is the ``EngineClient`` for ``workers > 0``. Workers are forked by a
template process (``zygote.py``) started as a fresh interpreter, so they come from a
clean parent however busy this process is. Per worker the pool holds a request ring and
a response ring (``ring.py``), one eventfd doorbell per direction and a control channel
(``channel.py``); this loop watches the response doorbell and the control channel with
``add_reader``, so one wake-up completes every finished request, and the channel's EOF
reveals a dead worker at once. The requests it held fail with 503, a replacement is
forked (backing off while workers keep dying, never giving up) and the dead worker's
replicas are loaded again.

Faults stay contained. A worker records in its request ring what it is running, so a
crash is blamed on the model that was running: a model whose requests crash workers
``QUARANTINE_CRASHES`` times in ``QUARANTINE_WINDOW`` seconds is quarantined (FAILED
with the reason, its requests answered 503 without reaching a worker) until it is
loaded again. A group that runs past its model's timeout is answered 504 and its worker
recycled. The template process is supervised (reaped, restarted, counted), and shutdown
keeps to one deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import signal
import struct
import subprocess
import time
from typing import Any

from inferpool.engine.client import EngineClient
from inferpool.engine.handles import WorkerHandle, start_template
from inferpool.engine.ipc import messages
from inferpool.engine.ipc.channel import Channel
from inferpool.engine.repository import discover
from inferpool.engine.scheduler import MIB, PlacementError, WorkerRoom, place
from inferpool.engine.states import ModelState
from inferpool.engine.worker.handler import Reply
from inferpool.errors import BadRequest, InferpoolError, NotReady, Overloaded
from inferpool.protocol.limits import DecodeLimits
from inferpool.settings import ModelSettings, ServerSettings

logger = logging.getLogger(__name__)

SPAWN_TIMEOUT = 60.0
# A worker that dies this soon after starting backs its slot off: 0.1 s, doubling, capped.
CRASH_WINDOW, MAX_BACKOFF = 10.0, 30.0
HEARTBEAT_INTERVAL = 5.0
SUPERVISE_INTERVAL = 0.25  # how often running groups are checked against their timeout
QUARANTINE_CRASHES, QUARANTINE_WINDOW = 3, 60.0
# Not live: no worker (or no template) could be started for this long.
WEDGED_AFTER = 60.0
EXIT_STATUS_WAIT = 1.0  # how long a crash report waits for the template's exit status
KILL_MARGIN = 0.5  # at shutdown, hung workers die this long before the grace period ends
# A model whose every replica is being replaced stays READY this long, its requests
# waiting for a replica (a recycle takes about a second); then it turns LOADING.
REPLICA_WAIT = 10.0


class Route:
    """Where one model's requests go: its index in the workers and its READY replicas."""

    def __init__(self, settings: ModelSettings, index: int, default_timeout: float) -> None:
        self.settings = settings
        self.index = index
        self.ready: list[WorkerHandle] = []
        self.slots: set[int] = set()  # the worker slots meant to hold a replica
        self.turn = 0
        self.empty_since: float | None = None  # since when no replica is ready
        self.back: asyncio.Event | None = None  # set when a replica is ready again
        self.waiting = 0  # requests waiting for it
        timeout = settings.timeout if settings.timeout is not None else default_timeout
        self.timeout = timeout if timeout and timeout > 0 else 0.0

    def replica_back(self) -> None:
        """A replica is ready again, or never will be: wake the waiting requests."""
        self.empty_since = None
        if self.back is not None:
            self.back.set()
            self.back = None


def oom_kills() -> int | None:
    """Processes of this cgroup (and below) the out-of-memory killer has killed so far.

    From cgroup v2's ``memory.events`` or v1's ``memory.oom_control`` (both count
    ``oom_kill``); None where neither can be read, and then no SIGKILL is taken for the
    model's doing.
    """
    try:
        with open("/proc/self/cgroup") as cgroup:
            entries = dict(line.strip().split(":", 2)[1:] for line in cgroup if ":" in line)
    except (OSError, ValueError):
        return None
    candidates = []
    if "memory" in entries:  # v1, or hybrid with the memory controller on v1
        candidates.append(f"/sys/fs/cgroup/memory{entries['memory']}/memory.oom_control")
    if "" in entries:
        candidates.append(f"/sys/fs/cgroup{entries[''].rstrip('/')}/memory.events")
    for path in candidates:
        try:
            with open(path) as counters:
                for line in counters:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def describe_exit(status: int | None) -> str:
    """A waitpid status in words: "killed by signal SIGSEGV", "exited with code 1"."""
    if status is None:
        return "exited"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"killed by signal {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return f"exited with code {os.WEXITSTATUS(status)}"


class PoolClient(EngineClient):
    _stopping = False
    _stop_deadline: float | None = None

    def __init__(self, settings: ServerSettings) -> None:
        self._tasks: set[asyncio.Task] = set()
        super().__init__(settings)
        self.count = settings.workers
        self.threads = max(1, (os.cpu_count() or 1) // self.count)
        self.max_queue = max(1, settings.max_queue)
        limit = settings.worker_memory_limit
        self.memory_limit = limit * MIB if limit > 0 else None
        self.limits = DecodeLimits.from_settings(settings)
        self.workers: list[WorkerHandle | None] = [None] * self.count
        self.routes: dict[str, Route] = {}
        self._by_index: dict[int, Route] = {}
        self._ids = itertools.count(1)
        self._indexes = itertools.count(1)
        # Supervision, readable by metrics and tests.
        self.template_restarts = 0
        self.worker_restarts = 0
        self.wedged: str | None = None  # why the process is not live, if it is not
        self._crashes = [0] * self.count  # quick deaths in a row, per slot (back-off)
        self._down_since: list[float | None] = [None] * self.count
        self._start_errors = [""] * self.count
        self._model_crashes: dict[str, collections.deque[float]] = {}
        self._exit_status: dict[int, int] = {}
        self._exit_waiters: dict[int, asyncio.Future] = {}
        self._oom_kills_seen = oom_kills() or 0
        self._zygote: subprocess.Popen | None = None
        self._zygote_channel: Channel | None = None
        self._template_up: asyncio.Event | None = None
        self._template_down_since: float | None = None  # until a worker starts again
        self._template_started = 0.0
        self._template_crashes = 0  # quick deaths in a row (back-off)
        self._closed = False

    # -- health ----------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        # Shutdown starts here, whoever sets it: the drain and the workers' stop share one
        # deadline, and a request still hung near its end has its worker killed.
        if value and not self._stopping:
            self._stop_deadline = time.monotonic() + self.settings.shutdown_timeout
            with contextlib.suppress(RuntimeError):  # no loop: nothing runs to be killed
                self._keep(asyncio.get_running_loop().create_task(self._kill_hung_at_deadline()))
            for route in self.routes.values():  # no replica comes back now
                route.replica_back()
        self._stopping = value

    def live_reason(self) -> str | None:
        if self._closed:
            return "the worker pool is closed"
        return self.wedged

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._template_up = asyncio.Event()
        self._start_zygote()
        await asyncio.gather(*(self._spawn(slot) for slot in range(self.count)))
        self._keep(asyncio.ensure_future(self._supervise()))

    def _keep(self, task: asyncio.Future) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _supervise(self) -> None:
        """Every ``SUPERVISE_INTERVAL``: timeouts, heartbeats, and whether the pool is wedged.

        A worker running a group longer than its model's timeout is recycled. Otherwise a
        worker silent for ``worker_heartbeat_timeout`` is killed (hung): any message or
        reply counts as a sign of life, and a worker answers pings between requests.
        """
        heartbeat = self.settings.worker_heartbeat_timeout
        ping_every = min(HEARTBEAT_INTERVAL, heartbeat / 4) if heartbeat > 0 else None
        pinged = time.monotonic()
        while not self.stopping:
            await asyncio.sleep(SUPERVISE_INTERVAL)
            now = time.monotonic()
            for worker in self._alive():
                running = worker.requests.running()
                if running is not None and self._past_timeout(worker, running, now):
                    continue
                if heartbeat > 0 and now - worker.last_seen > heartbeat:
                    if running is not None and self._timeout_of(running[0]) > 0:
                        continue  # busy with a group its model's timeout still allows
                    logger.error(
                        "%s answered nothing for %.0fs; killing it", worker.describe(), heartbeat
                    )
                    self._kill(worker, f"{worker.describe()} exited", crash=False)
            if ping_every is not None and now - pinged >= ping_every:
                pinged = now
                for worker in self._alive():
                    with contextlib.suppress(OSError):
                        worker.post(messages.PING)
            self._check_wedged(now)
            for name, route in self.routes.items():
                if route.empty_since is not None and now - route.empty_since > REPLICA_WAIT:
                    self._set_state(name, ModelState.LOADING, "reloading: its workers restarted")

    def _timeout_of(self, model_index: int) -> float:
        route = self._by_index.get(model_index)
        if route is not None:
            return route.timeout
        return self.settings.model_timeout if self.settings.model_timeout > 0 else 0.0

    def _past_timeout(self, worker: WorkerHandle, running: tuple, now: float) -> bool:
        """Recycle ``worker`` if its group runs past its model's timeout: 504 for the group."""
        model_index, request_ids, started_ns = running
        timeout = self._timeout_of(model_index)
        if not timeout or now - started_ns / 1e9 <= timeout:
            return False
        route = self._by_index.get(model_index)
        name = route.settings.name if route is not None else f"#{model_index}"
        message = (
            f"model '{name}' ran longer than its timeout ({timeout:g} s); "
            f"{worker.describe()} was recycled"
        )
        logger.error("%s", message)
        late = Reply(504, message.encode())
        for request_id in request_ids:
            future = worker.inflight.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(late)
        self._kill(worker, f"{worker.describe()} was recycled ({message})", crash=False)
        return True

    def _kill(self, worker: WorkerHandle, reason: str, crash: bool) -> None:
        if worker.pid:
            with contextlib.suppress(OSError):
                os.kill(worker.pid, signal.SIGKILL)
        self._worker_died(worker, reason, crash=crash)

    def _check_wedged(self, now: float) -> None:
        if (
            self._template_down_since is not None
            and self._zygote_channel is not None
            and now - self._template_started > CRASH_WINDOW
        ):
            self._template_down_since = None  # restarted, and it stays up
        reasons = []
        since = self._template_down_since
        if since is not None and now - since > WEDGED_AFTER:
            reasons.append(
                f"the worker template process could not be restarted for {now - since:.0f}s"
            )
        for slot, since in enumerate(self._down_since):
            if since is not None and now - since > WEDGED_AFTER:
                error = self._start_errors[slot]
                reasons.append(
                    f"worker {slot} could not be started for {now - since:.0f}s"
                    + (f": {error}" if error else "")
                )
        wedged = "; ".join(reasons) or None
        if wedged and wedged != self.wedged:
            logger.error("not live: %s", wedged)
        self.wedged = wedged

    # -- the template process ----------------------------------------------------------------
    def _start_zygote(self) -> None:
        self._zygote, self._zygote_channel = start_template(self.threads)
        asyncio.get_running_loop().add_reader(self._zygote_channel.fileno(), self._on_template)
        repository = self.settings.model_repository
        with contextlib.suppress(FileNotFoundError):  # load_repository reports it
            found = discover(repository) if repository is not None else []
            models = [d.settings.model_dump(mode="json") for d in found if d.settings]
            if models:  # loaded before the first fork, shared by every worker
                document = messages.encode_control({"models": models})
                with contextlib.suppress(OSError):  # it died at once: its EOF says so
                    self._zygote_channel.send(messages.PRELOAD, document)
        self._template_started = time.monotonic()
        assert self._template_up is not None
        self._template_up.set()

    def _on_template(self) -> None:
        """Exit statuses of reaped workers; EOF means the template itself has gone."""
        channel = self._zygote_channel
        while channel is not None:
            try:
                op, payload, fds = channel.receive(block=False)
            except BlockingIOError:
                return
            except (EOFError, OSError):
                self._template_gone()
                return
            for fd in fds:
                os.close(fd)
            if op == messages.EXITED:
                document = messages.decode_control(payload)
                self._exit_reported(document["pid"], document["status"])

    def _exit_reported(self, pid: int, status: int) -> None:
        waiter = self._exit_waiters.pop(pid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(status)
            return
        if len(self._exit_status) > 1024:  # never asked for: keep only recent ones
            self._exit_status.clear()
        self._exit_status[pid] = status

    def _template_gone(self) -> None:
        channel, process = self._zygote_channel, self._zygote
        if channel is None:
            return
        asyncio.get_running_loop().remove_reader(channel.fileno())
        channel.close()
        self._zygote_channel = None
        assert self._template_up is not None
        self._template_up.clear()
        if self.stopping:
            return
        if self._template_down_since is None:
            self._template_down_since = time.monotonic()
        # Workers it had not forked yet never will be: their starts fail now, and retry.
        for worker in self._alive():
            if not worker.hello.done():
                self._worker_died(worker, "the worker template process exited")
        self._keep(asyncio.ensure_future(self._restart_template(process)))

    async def _restart_template(self, process: subprocess.Popen | None) -> None:
        how = "exited"
        if process is not None:
            status = await self._reap(process)
            how = describe_exit(status)
            how = f"(pid {process.pid}) {how}"
        quick = time.monotonic() - self._template_started < CRASH_WINDOW
        self._template_crashes = self._template_crashes + 1 if quick else 0
        delay = 0.0
        if self._template_crashes:
            delay = min(MAX_BACKOFF, 0.1 * 2 ** (self._template_crashes - 1))
        logger.error("the worker template process %s; restarting it in %.1fs", how, delay)
        while not self.stopping:
            await asyncio.sleep(delay)
            try:
                self._start_zygote()
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
                self._zygote.pid if self._zygote else 0, self.template_restarts,
            )  # fmt: skip
            return

    async def _reap(self, process: subprocess.Popen) -> int | None:
        """Wait for the exited child (no zombie); its waitpid status, or None."""
        for _ in range(100):  # its channel closes a moment before it can be reaped
            code = process.poll()
            if code is not None:
                return -code if code < 0 else code << 8
            await asyncio.sleep(0.05)
        process.kill()
        await asyncio.to_thread(process.wait)
        return None

    # -- workers -----------------------------------------------------------------------------
    async def _spawn(self, slot: int) -> WorkerHandle:
        """Start a worker in ``slot``; InferpoolError if it does not come up."""
        assert self._template_up is not None
        try:
            await asyncio.wait_for(self._template_up.wait(), SPAWN_TIMEOUT)
        except TimeoutError:
            raise InferpoolError("the worker template process is not running") from None
        worker = WorkerHandle(slot, self.max_queue)
        self.workers[slot] = worker
        loop = asyncio.get_running_loop()
        try:
            assert self._zygote_channel is not None
            worker.ask_template(self._zygote_channel, self.threads, self.limits)
        except OSError as exc:
            worker.close(f"worker {slot} could not start")
            raise InferpoolError(f"cannot start worker {slot}: {exc}") from None
        loop.add_reader(worker.channel.fileno(), self._on_control, worker)
        loop.add_reader(worker.reply_bell, worker.drain_replies)
        worker.alive = True
        try:
            await asyncio.wait_for(asyncio.shield(worker.hello), SPAWN_TIMEOUT)
        except TimeoutError:
            worker.close(f"worker {slot} did not start")
            raise InferpoolError(f"worker {slot} did not start in {SPAWN_TIMEOUT:.0f}s") from None
        except InferpoolError:
            raise InferpoolError(f"worker {slot} exited while starting") from None
        logger.info("worker %d started (pid %d)", slot, worker.pid)
        worker.template = self._zygote
        self._template_down_since = None  # the template works
        return worker

    async def close(self) -> None:
        self.stopping = True
        await self.stop_watching()  # poll mode: no load starts while the pool stops
        deadline = self._stop_deadline or time.monotonic()
        while any(w.inflight for w in self._alive()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        exiting = []
        for worker in self._alive():
            with contextlib.suppress(OSError):
                worker.post(messages.STOP)
            exiting.append(worker.exited)
        if exiting:
            await asyncio.wait(exiting, timeout=max(0.5, deadline - time.monotonic()))
            for worker in self._alive():
                logger.warning("%s did not stop; killing it", worker.describe())
                self._kill(worker, f"{worker.describe()} was stopped", crash=False)
        for task in list(self._tasks):
            task.cancel()
        for worker in self.workers:  # any still starting
            if worker is not None:
                worker.close("the server is shutting down")
        channel, self._zygote_channel = self._zygote_channel, None
        if channel is not None:
            with contextlib.suppress(ValueError):
                asyncio.get_running_loop().remove_reader(channel.fileno())
            channel.close()  # its EOF makes the template exit
        if self._zygote is not None:
            try:
                wait = max(0.5, min(5.0, deadline - time.monotonic()))
                await asyncio.to_thread(self._zygote.wait, wait)
            except subprocess.TimeoutExpired:
                self._zygote.kill()
                await asyncio.to_thread(self._zygote.wait)
        self._closed = True

    async def _kill_hung_at_deadline(self) -> None:
        """Shortly before the grace period ends, kill workers still holding requests.

        Their requests are answered 503 in time for the frontends to write them out, so
        a hung predict never stretches shutdown past ``shutdown_timeout``.
        """
        assert self._stop_deadline is not None
        await asyncio.sleep(max(0.0, self._stop_deadline - KILL_MARGIN - time.monotonic()))
        for worker in self._alive():
            if worker.inflight:
                logger.warning(
                    "%s still runs requests at the end of the shutdown grace period; "
                    "killing it", worker.describe(),
                )  # fmt: skip
                self._kill(worker, f"{worker.describe()} was stopped at shutdown", crash=False)

    def _alive(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w is not None and w.alive]

    # -- control messages ------------------------------------------------------------------
    def _on_control(self, worker: WorkerHandle) -> None:
        worker.last_seen = time.monotonic()
        while worker.alive:
            try:
                op, payload, fds = worker.channel.receive(block=False)
            except BlockingIOError:
                return
            except (EOFError, OSError):
                self._worker_died(worker)
                return
            for fd in fds:
                os.close(fd)
            if op == messages.REPLY:
                fields = messages.HEADER.unpack_from(payload)
                worker.complete(fields, payload[messages.HEADER_SIZE :])
            elif op == messages.LOADED:
                document = messages.decode_control(payload)
                future = worker.loads.pop(document["index"], None)
                if future is not None and not future.done():
                    future.set_result(document)
            elif op == messages.HELLO:
                worker.pid = messages.decode_control(payload)["pid"]
                if not worker.hello.done():
                    worker.hello.set_result(None)

    # -- faults ----------------------------------------------------------------------------
    def _worker_died(self, worker: WorkerHandle, reason: str = "", crash: bool = True) -> None:
        """It is gone (or killed): answer what it held, blame its model, replace it."""
        if not worker.alive:
            return
        starting = not worker.hello.done()
        running = None if worker.closed else worker.requests.running()
        worker.drain_replies()  # answers it wrote before dying still count
        worker.close(reason or f"{worker.describe()} exited")
        if self.stopping or starting:
            return  # a worker that never started: its _spawn fails and is retried
        logger.error("%s: %s; starting a replacement", worker.describe(), reason or "exited")
        for name in worker.models:
            route = self.routes.get(name)
            if route is None or worker not in route.ready:
                continue
            route.ready.remove(worker)
            if not route.ready and route.empty_since is None:
                # It stays READY a moment: its requests wait for the replacement's replica.
                route.empty_since = time.monotonic()
        if worker.template is not self._zygote:
            # Its template died before it: it may be ours to reap now (as PID 1 it is).
            self._keep(asyncio.ensure_future(self._reap_orphan(worker.pid)))
        if crash and running is not None:
            self._blame(worker, running)
        # Back off from a slot whose workers die soon after starting, without a request to
        # blame (a request that kills workers is the quarantine's business, not a reason
        # to keep the other models waiting for a worker).
        quick = crash and running is None and time.monotonic() - worker.started_at < CRASH_WINDOW
        self._crashes[worker.slot] = self._crashes[worker.slot] + 1 if quick else 0
        if self._down_since[worker.slot] is None:
            self._down_since[worker.slot] = time.monotonic()
        self._keep(asyncio.ensure_future(self._replace(worker.slot)))

    async def _reap_orphan(self, pid: int) -> None:
        for _ in range(40):  # its channel closes a moment before it can be reaped
            try:
                reaped, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return  # not our child: init reaps it
            if reaped:
                self._exit_reported(pid, status)
                return
            await asyncio.sleep(0.05)

    def _blame(self, worker: WorkerHandle, running: tuple) -> None:
        """Count a crash against the model it was running, once its exit status is known."""
        route = self._by_index.get(running[0])
        if route is None:
            return
        self._on_template()  # its exit status may already be waiting
        status = self._exit_status.pop(worker.pid, None)
        if status is not None:
            self._count_crash(worker, route, running[1], status)
        else:
            self._keep(asyncio.ensure_future(self._blame_when_reaped(worker, route, running[1])))

    async def _blame_when_reaped(
        self, worker: WorkerHandle, route: Route, request_ids: tuple
    ) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._exit_waiters[worker.pid] = waiter
        try:
            status = await asyncio.wait_for(waiter, EXIT_STATUS_WAIT)
        except TimeoutError:
            logger.warning("no exit status for %s; its crash is not counted", worker.describe())
            return
        finally:
            self._exit_waiters.pop(worker.pid, None)
        if self._by_index.get(route.index) is route:  # not unloaded or replaced meanwhile
            self._count_crash(worker, route, request_ids, status)

    def _count_crash(
        self, worker: WorkerHandle, route: Route, request_ids: tuple, status: int
    ) -> None:
        """Quarantine a model whose requests keep killing workers."""
        name, how = route.settings.name, describe_exit(status)
        if not self._model_caused(status):
            logger.error(
                "%s %s while running model '%s' (requests %s); killed from outside, "
                "not counted against the model", worker.describe(), how, name, request_ids,
            )  # fmt: skip
            return
        logger.error(
            "%s %s while running model '%s' (requests %s)",
            worker.describe(), how, name, request_ids,
        )  # fmt: skip
        now = time.monotonic()
        crashes = self._model_crashes.setdefault(name, collections.deque())
        crashes.append(now)
        while crashes and now - crashes[0] > QUARANTINE_WINDOW:
            crashes.popleft()
        if len(crashes) >= QUARANTINE_CRASHES:
            self._quarantine(
                route,
                f"quarantined: its requests crashed workers {len(crashes)} times "
                f"in {QUARANTINE_WINDOW:.0f} s: {how}",
            )

    def _model_caused(self, status: int) -> bool:
        """Whether a worker's death was its model's doing, not someone else's.

        A fatal signal the process raised itself (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, ...)
        or an error exit is the model's. SIGKILL is anyone's (an operator, a test, a node
        agent) unless the out-of-memory killer of our cgroup sent it; SIGTERM and SIGINT
        come from outside.
        """
        if not os.WIFSIGNALED(status):
            return os.WEXITSTATUS(status) != 0
        number = os.WTERMSIG(status)
        if number == signal.SIGKILL:
            kills = oom_kills()
            caused = kills is not None and kills > self._oom_kills_seen
            if kills is not None:
                self._oom_kills_seen = kills
            return caused
        return number not in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def _quarantine(self, route: Route, reason: str) -> None:
        name = route.settings.name
        logger.error("model '%s' is %s", name, reason)
        self._drop_route(route)
        self._unload_from(self._alive(), name, route.index)
        with contextlib.suppress(InferpoolError):
            status = self.table.find(name)
            status.state, status.reason = ModelState.FAILED, reason
            # One client's poisonous input must not take the whole server out of its
            # Service: the other models keep the server ready. Loading the model again
            # (and serving) makes it count again.
            status.required = False

    def _set_state(
        self,
        name: str,
        state: ModelState,
        reason: str,
        when: tuple[ModelState, ...] = (ModelState.READY, ModelState.LOADING),
    ) -> None:
        with contextlib.suppress(InferpoolError):
            status = self.table.find(name)
            if status.state in when:
                status.state, status.reason = state, reason

    async def _replace(self, slot: int) -> None:
        """Start a worker in ``slot`` again, backing off while they keep dying; never give up."""
        attempt = 0
        while not self.stopping:
            failures = self._crashes[slot] + attempt
            delay = 0.05 if failures == 0 else min(MAX_BACKOFF, 0.1 * 2 ** (failures - 1))
            if delay >= 1:
                logger.warning("worker %d keeps failing; next start in %.1fs", slot, delay)
            await asyncio.sleep(delay)
            if self.stopping:
                return
            try:
                worker = await self._spawn(slot)
            except InferpoolError as exc:
                attempt += 1
                self._start_errors[slot] = exc.message
                logger.error("cannot start worker %d: %s", slot, exc.message)
                continue
            self.worker_restarts += 1
            self._down_since[slot] = None
            self._start_errors[slot] = ""
            routes = [route for route in self.routes.values() if slot in route.slots]
            await asyncio.gather(*(self._reload(worker, route) for route in routes))
            return

    async def _reload(self, worker: WorkerHandle, route: Route) -> None:
        name = route.settings.name
        try:
            await self._load_on(worker, route, route.index)
        except InferpoolError as exc:
            logger.error("cannot reload '%s' on %s: %s", name, worker.describe(), exc.message)
            if not route.ready and self.routes.get(name) is route:
                self._set_state(name, ModelState.FAILED, exc.message)
                route.replica_back()  # its waiting requests fail now
            return
        if self.routes.get(name) is route and worker.alive:
            route.ready.append(worker)
            route.replica_back()
            # A model that had no replica left comes back (FAILED included: the failure
            # was the pool's, a quarantined model has no route to reload).
            when = (ModelState.READY, ModelState.LOADING, ModelState.FAILED)
            self._set_state(name, ModelState.READY, "", when)

    # -- loading ---------------------------------------------------------------------------
    async def _load_on(self, worker: WorkerHandle, route: Route, index: int) -> dict[str, Any]:
        name = route.settings.name
        future = asyncio.get_running_loop().create_future()
        worker.loads[index] = future
        # The version it serves now, if any, stays its record when this load fails.
        previous = worker.models.get(name)
        worker.models[name] = (index, 0)
        document = {"index": index, "settings": route.settings.model_dump(mode="json")}
        try:
            worker.post(messages.LOAD, messages.encode_control(document))
            answer = await future
            if not answer["ok"]:
                raise InferpoolError(answer["error"])
        except (OSError, InferpoolError) as exc:
            worker.loads.pop(index, None)
            if worker.models.get(name, (None,))[0] == index:
                if previous is None:
                    del worker.models[name]
                else:
                    worker.models[name] = previous
            if isinstance(exc, OSError):
                raise InferpoolError(f"{worker.describe()} exited") from None
            raise
        worker.models[name] = (index, answer["size"])
        return answer

    def _unload_from(self, workers: list[WorkerHandle], name: str, index: int) -> None:
        """Unload version ``index`` of a model from ``workers``.

        Sent to every live one, whatever its record says: a reload replaces the record
        with the new version while the worker still holds the old one (a worker ignores
        a version it does not hold).
        """
        message = messages.encode_control({"index": index})
        for worker in workers:
            if not worker.alive:
                continue
            if worker.models.get(name, (None,))[0] == index:
                del worker.models[name]
            with contextlib.suppress(OSError):
                worker.post(messages.UNLOAD, message)

    def _rooms(self, workers: list[WorkerHandle], name: str) -> list[WorkerRoom]:
        rooms = []
        for worker in workers:
            others = {k: v for k, v in worker.models.items() if k != name}
            used = sum(size for _, size in others.values())
            rooms.append(WorkerRoom(worker.slot, used, len(others)))
        return rooms

    def _drop_route(self, route: Route) -> None:
        name = route.settings.name
        if self.routes.get(name) is route:
            del self.routes[name]
        self._by_index.pop(route.index, None)
        route.replica_back()

    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        name = settings.name
        alive = [w for w in self._alive() if w.hello.done()]
        if not alive:
            raise InferpoolError("no worker is running")
        wanted = settings.replicas or len(alive)
        route = Route(settings, next(self._indexes), self.settings.model_timeout)
        by_slot = {worker.slot: worker for worker in alive}
        # The first replica goes where there is the most room; it tells the model's size.
        rooms = self._rooms(alive, name)
        first = by_slot[min(rooms, key=lambda r: (r.used, r.replicas, r.worker)).worker]
        answer = await self._load_on(first, route, route.index)
        size = answer["size"]
        alive = [w for w in self._alive() if w.hello.done()]
        try:
            chosen = place(name, wanted, size, self._rooms(alive, name), self.memory_limit)
        except PlacementError as exc:
            self._unload_from([first], name, route.index)
            raise InferpoolError(str(exc)) from None
        if first.slot not in chosen:
            self._unload_from([first], name, route.index)
        by_slot = {worker.slot: worker for worker in alive}
        others = [by_slot[slot] for slot in chosen if slot != first.slot]
        results = await asyncio.gather(
            *(self._load_on(worker, route, route.index) for worker in others),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        placed = [w for w in others if w.alive and w.models.get(name, (None,))[0] == route.index]
        if first.slot in chosen and first.alive:
            placed.insert(0, first)
        if errors:
            self._unload_from(placed, name, route.index)
            raise (
                errors[0]
                if isinstance(errors[0], InferpoolError)
                else InferpoolError(str(errors[0]))
            )
        route.ready = placed
        route.slots = set(chosen)
        if settings.replicas is None:
            # One replica per worker: slots that are restarting get theirs when they are back.
            route.slots = set(range(self.count))
        old = self.routes.get(name)
        self.routes[name] = route
        self._by_index[route.index] = route
        self._model_crashes.pop(name, None)  # loaded again: a quarantine is lifted
        if old is not None:
            self._by_index.pop(old.index, None)
            old.replica_back()  # requests waiting for the old version take the new one
            self._unload_from(self._alive(), name, old.index)
        predictor = answer.get("predictor")
        logger.info(
            "model '%s': %d replica(s) on workers %s, %.1f MiB each%s",
            name, len(placed), [w.slot for w in placed], size / MIB,
            f"; predicted by {predictor}" if predictor else "",
        )  # fmt: skip
        return answer["metadata"]

    async def _unload(self, name: str) -> None:
        route = self.routes.get(name)
        if route is not None:
            self._drop_route(route)
            self._unload_from(self._alive(), name, route.index)
        self._model_crashes.pop(name, None)

    # -- inference -------------------------------------------------------------------------
    async def _infer(
        self, name: str, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> Reply:
        route = self.routes.get(name)
        if route is None:
            raise NotReady(f"model '{name}' has no ready replica")
        if not route.ready:
            route = await self._wait_for_replica(name, route, deadline)
        ready = route.ready
        # Least loaded; ties go round-robin, so an idle pool still spreads its work.
        route.turn += 1
        start = route.turn % len(ready)
        worker = None
        for candidate in ready[start:] + ready[:start]:
            if len(candidate.inflight) < self.max_queue and (
                worker is None or len(candidate.inflight) < len(worker.inflight)
            ):
                worker = candidate
        if worker is None:
            raise Overloaded(
                f"model '{name}' is overloaded: every replica's queue is full "
                f"({self.max_queue} requests per worker); retry later"
            )
        request_id = next(self._ids)
        # Packed before anything is registered: a value it cannot carry is the client's
        # error (400) and leaves nothing behind.
        try:
            header = messages.request_header(
                request_id, route.index, kind, json_length, deadline, len(body)
            )
        except (ValueError, OverflowError, TypeError, struct.error) as exc:
            raise BadRequest(str(exc)) from None
        future = asyncio.get_running_loop().create_future()
        worker.inflight[request_id] = future
        try:
            if worker.requests.push(header, body):
                os.eventfd_write(worker.request_bell, 1)
            else:  # bigger than a slot: its own memfd over the control channel
                worker.post(messages.REQUEST, header, body)
        except OSError:  # it died and its EOF is not handled yet, or no fd for the memfd
            worker.inflight.pop(request_id, None)
            return Reply(503, f"{worker.describe()} could not take the request; retry it".encode())
        except BaseException:
            worker.inflight.pop(request_id, None)
            raise
        try:
            return await future
        except asyncio.CancelledError:
            if worker.alive and request_id in worker.inflight:
                # Its caller went away: the worker drops it if it has not started.
                with contextlib.suppress(OSError):
                    cancel = messages.encode_control({"id": request_id})
                    worker.post(messages.CANCEL, cancel)
            raise

    async def _wait_for_replica(self, name: str, route: Route, deadline: float | None) -> Route:
        """Wait (bounded) while the workers holding the model's replicas are replaced."""
        if self.stopping:
            raise NotReady(f"model '{name}' has no ready replica: the server is shutting down")
        if route.waiting >= self.max_queue * self.count:
            raise Overloaded(f"model '{name}' is overloaded: its workers are restarting")
        if route.back is None:
            route.back = asyncio.Event()
        wait = REPLICA_WAIT if deadline is None else min(REPLICA_WAIT, deadline - time.monotonic())
        route.waiting += 1
        try:
            await asyncio.wait_for(route.back.wait(), max(0.0, wait))
        except TimeoutError:
            pass
        finally:
            route.waiting -= 1
        current = self.routes.get(name)
        if current is not None and current.ready:
            return current
        try:
            status = self.table.find(name)
        except InferpoolError:
            status = None
        if status is not None and status.state is not ModelState.READY:
            raise NotReady(status.describe())  # e.g. quarantined meanwhile
        raise NotReady(f"model '{name}' has no ready replica: its workers are restarting")
