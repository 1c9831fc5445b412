"""The worker pool: spawn workers, dispatch requests to them, survive their deaths.

``PoolClient`` is the ``EngineClient`` for ``workers > 0``. Workers are forked by a
template process (``zygote.py``) started as a fresh interpreter, so they come from a
clean parent however busy this process is. Per worker the pool holds a request ring and
a response ring (``ring.py``), one eventfd doorbell per direction and a control channel
(``channel.py``); this loop watches the response doorbell and the control channel with
``add_reader``, so one wake-up completes every finished request, and the channel's EOF
reveals a dead worker at once. The requests it held fail with 503, a replacement is
forked and the dead worker's replicas are loaded again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import subprocess
import time
from typing import Any

from inferpool.engine import messages
from inferpool.engine.channel import Channel
from inferpool.engine.client import EngineClient
from inferpool.engine.handler import Reply
from inferpool.engine.repository import discover
from inferpool.engine.scheduler import MIB, PlacementError, WorkerRoom, place
from inferpool.engine.states import ModelState
from inferpool.engine.workers import WorkerHandle, start_template
from inferpool.errors import InferpoolError, NotReady, Overloaded
from inferpool.protocol.limits import DecodeLimits
from inferpool.settings import ModelSettings, ServerSettings

logger = logging.getLogger(__name__)

SPAWN_TIMEOUT = 60.0
# A worker that dies this soon after starting, this many times in a row, is not retried.
CRASH_WINDOW, MAX_CRASHES = 10.0, 5
HEARTBEAT_INTERVAL = 5.0


class Route:
    """Where one model's requests go: its index in the workers and its READY replicas."""

    def __init__(self, settings: ModelSettings, index: int) -> None:
        self.settings = settings
        self.index = index
        self.ready: list[WorkerHandle] = []
        self.turn = 0


class PoolClient(EngineClient):
    def __init__(self, settings: ServerSettings) -> None:
        super().__init__(settings)
        self.count = settings.workers
        self.threads = max(1, (os.cpu_count() or 1) // self.count)
        self.max_queue = max(1, settings.max_queue)
        limit = settings.worker_memory_limit
        self.memory_limit = limit * MIB if limit > 0 else None
        self.limits = DecodeLimits.from_settings(settings)
        self.workers: list[WorkerHandle | None] = [None] * self.count
        self.routes: dict[str, Route] = {}
        self.broken: str | None = None
        self._ids = itertools.count(1)
        self._indexes = itertools.count(1)
        self._crashes = [0] * self.count
        self._zygote: subprocess.Popen | None = None
        self._zygote_channel: Channel | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def live(self) -> bool:
        return not self.stopping and self.broken is None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._start_zygote()
        await asyncio.gather(*(self._spawn(slot) for slot in range(self.count)))
        self._keep(asyncio.ensure_future(self._heartbeats()))

    def _keep(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _heartbeats(self) -> None:
        """Ping every worker; one silent for ``worker_heartbeat_timeout`` is killed (hung).

        Any message or reply counts as a sign of life, and a worker answers pings
        between requests, so only a single request running that long looks hung.
        """
        timeout = self.settings.worker_heartbeat_timeout
        if timeout <= 0:
            return
        while not self.stopping:
            await asyncio.sleep(min(HEARTBEAT_INTERVAL, timeout / 4))
            now = time.monotonic()
            for worker in self._alive():
                if now - worker.last_seen > timeout:
                    logger.error(
                        "%s answered nothing for %.0fs; killing it", worker.describe(), timeout
                    )
                    with contextlib.suppress(OSError):
                        os.kill(worker.pid, signal.SIGKILL)
                    self._worker_died(worker)
                else:
                    with contextlib.suppress(OSError):
                        worker.post(messages.PING)

    def _start_zygote(self) -> None:
        self._zygote, self._zygote_channel = start_template(self.threads)
        asyncio.get_running_loop().add_reader(self._zygote_channel.fileno(), self._zygote_gone)
        repository = self.settings.model_repository
        with contextlib.suppress(FileNotFoundError):  # load_repository reports it
            found = discover(repository) if repository is not None else []
            models = [d.settings.model_dump(mode="json") for d in found if d.settings]
            if models:  # loaded before the first fork, shared by every worker
                document = messages.encode_control({"models": models})
                self._zygote_channel.send(messages.PRELOAD, document)

    def _zygote_gone(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._zygote_channel.fileno())
        if not self.stopping:
            self.broken = "the worker template process exited; workers cannot be replaced"
            logger.error(self.broken)

    async def _spawn(self, slot: int) -> WorkerHandle:
        worker = WorkerHandle(slot, self.max_queue)
        self.workers[slot] = worker
        loop = asyncio.get_running_loop()
        try:
            worker.ask_template(self._zygote_channel, self.threads, self.limits)
        except OSError as exc:
            raise InferpoolError(f"cannot start worker {slot}: {exc}") from None
        loop.add_reader(worker.channel.fileno(), self._on_control, worker)
        loop.add_reader(worker.reply_bell, worker.drain_replies)
        worker.alive = True
        try:
            await asyncio.wait_for(asyncio.shield(worker.hello), SPAWN_TIMEOUT)
        except TimeoutError:
            self._worker_died(worker)
            raise InferpoolError(f"worker {slot} did not start in {SPAWN_TIMEOUT:.0f}s") from None
        logger.info("worker %d started (pid %d)", slot, worker.pid)
        return worker

    async def close(self) -> None:
        self.stopping = True
        deadline = time.monotonic() + self.settings.shutdown_timeout
        while any(w.inflight for w in self._alive()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        exiting = []
        for worker in self._alive():
            with contextlib.suppress(OSError):
                worker.post(messages.STOP)
            exiting.append(worker.exited)
        if exiting:
            await asyncio.wait(exiting, timeout=5)
            for worker in self._alive():
                logger.warning("%s did not stop; killing it", worker.describe())
                with contextlib.suppress(OSError):
                    os.kill(worker.pid, signal.SIGKILL)
                self._worker_died(worker)
        for task in self._tasks:
            task.cancel()
        if self._zygote_channel is not None:
            with contextlib.suppress(ValueError):
                asyncio.get_running_loop().remove_reader(self._zygote_channel.fileno())
            self._zygote_channel.close()
        if self._zygote is not None:
            try:
                await asyncio.to_thread(self._zygote.wait, 5)
            except subprocess.TimeoutExpired:
                self._zygote.kill()
                self._zygote.wait()

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
    def _worker_died(self, worker: WorkerHandle) -> None:
        if not worker.alive:
            return
        worker.drain_replies()  # answers it wrote before dying still count
        worker.close(f"{worker.describe()} exited")
        if self.stopping:
            return
        logger.error("%s exited; starting a replacement", worker.describe())
        for name in worker.models:
            route = self.routes.get(name)
            if route is None or worker not in route.ready:
                continue
            route.ready.remove(worker)
            if not route.ready:
                self._set_state(name, ModelState.LOADING, f"reloading: {worker.describe()} exited")
        self._keep(asyncio.ensure_future(self._replace(worker)))

    def _set_state(self, name: str, state: ModelState, reason: str) -> None:
        with contextlib.suppress(InferpoolError):
            status = self.table.find(name)
            if status.state in (ModelState.READY, ModelState.LOADING):
                status.state, status.reason = state, reason

    async def _replace(self, dead: WorkerHandle) -> None:
        slot = dead.slot
        quick = time.monotonic() - dead.started_at < CRASH_WINDOW
        self._crashes[slot] = self._crashes[slot] + 1 if quick else 1
        if self._crashes[slot] > MAX_CRASHES:
            self.broken = f"worker {slot} crashed {MAX_CRASHES} times in a row; not restarting it"
            logger.error(self.broken)
            self._fail_unplaced(dead)
            return
        await asyncio.sleep(0.1 * 2 ** (self._crashes[slot] - 1))
        try:
            worker = await self._spawn(slot)
        except InferpoolError as exc:
            logger.error("cannot replace worker %d: %s", slot, exc.message)
            return
        await asyncio.gather(
            *(
                self._reload(worker, name, index)
                for name, (index, _) in dead.models.items()
                if name in self.routes and self.routes[name].index == index
            )
        )

    async def _reload(self, worker: WorkerHandle, name: str, index: int) -> None:
        route = self.routes[name]
        try:
            await self._load_on(worker, route, index)
        except InferpoolError as exc:
            logger.error("cannot reload '%s' on %s: %s", name, worker.describe(), exc.message)
            if not route.ready:
                self._set_state(name, ModelState.FAILED, exc.message)
            return
        if self.routes.get(name) is route:
            route.ready.append(worker)
            self._set_state(name, ModelState.READY, "")

    def _fail_unplaced(self, dead: WorkerHandle) -> None:
        for name in dead.models:
            route = self.routes.get(name)
            if route is not None and not route.ready:
                self._set_state(name, ModelState.FAILED, self.broken or "no worker holds it")

    # -- loading ---------------------------------------------------------------------------
    async def _load_on(self, worker: WorkerHandle, route: Route, index: int) -> dict[str, Any]:
        future = asyncio.get_running_loop().create_future()
        worker.loads[index] = future
        worker.models[route.settings.name] = (index, 0)
        document = {"index": index, "settings": route.settings.model_dump(mode="json")}
        try:
            worker.post(messages.LOAD, messages.encode_control(document))
            answer = await future
        except OSError:
            worker.loads.pop(index, None)
            worker.models.pop(route.settings.name, None)
            raise InferpoolError(f"{worker.describe()} exited") from None
        except InferpoolError:
            worker.models.pop(route.settings.name, None)
            raise
        if not answer["ok"]:
            worker.models.pop(route.settings.name, None)
            raise InferpoolError(answer["error"])
        worker.models[route.settings.name] = (index, answer["size"])
        return answer

    def _unload_from(self, workers: list[WorkerHandle], name: str, index: int) -> None:
        for worker in workers:
            if worker.alive and worker.models.get(name, (None,))[0] == index:
                del worker.models[name]
                with contextlib.suppress(OSError):
                    worker.post(messages.UNLOAD, messages.encode_control({"index": index}))

    def _rooms(self, workers: list[WorkerHandle], name: str) -> list[WorkerRoom]:
        rooms = []
        for worker in workers:
            others = {k: v for k, v in worker.models.items() if k != name}
            used = sum(size for _, size in others.values())
            rooms.append(WorkerRoom(worker.slot, used, len(others)))
        return rooms

    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        name = settings.name
        alive = self._alive()
        if not alive:
            raise InferpoolError("no worker is running")
        wanted = settings.replicas or len(alive)
        route = Route(settings, next(self._indexes))
        by_slot = {worker.slot: worker for worker in alive}
        # The first replica goes where there is the most room; it tells the model's size.
        rooms = self._rooms(alive, name)
        first = by_slot[min(rooms, key=lambda r: (r.used, r.replicas, r.worker)).worker]
        answer = await self._load_on(first, route, route.index)
        size = answer["size"]
        try:
            chosen = place(name, wanted, size, self._rooms(alive, name), self.memory_limit)
        except PlacementError as exc:
            self._unload_from([first], name, route.index)
            raise InferpoolError(str(exc)) from None
        if first.slot not in chosen:
            self._unload_from([first], name, route.index)
        others = [by_slot[slot] for slot in chosen if slot != first.slot]
        results = await asyncio.gather(
            *(self._load_on(worker, route, route.index) for worker in others),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        placed = [w for w in others if w.alive and w.models.get(name, (None,))[0] == route.index]
        if first.slot in chosen:
            placed.insert(0, first)
        if errors:
            self._unload_from(placed, name, route.index)
            raise (
                errors[0]
                if isinstance(errors[0], InferpoolError)
                else InferpoolError(str(errors[0]))
            )
        route.ready = placed
        old = self.routes.get(name)
        self.routes[name] = route
        if old is not None:
            self._unload_from(self._alive(), name, old.index)
        predictor = answer.get("predictor")
        logger.info(
            "model '%s': %d replica(s) on workers %s, %.1f MiB each%s",
            name, len(placed), [w.slot for w in placed], size / MIB,
            f"; predicted by {predictor}" if predictor else "",
        )  # fmt: skip
        return answer["metadata"]

    async def _unload(self, name: str) -> None:
        route = self.routes.pop(name, None)
        if route is not None:
            self._unload_from(self._alive(), name, route.index)

    # -- inference -------------------------------------------------------------------------
    async def _infer(
        self, name: str, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> Reply:
        route = self.routes.get(name)
        ready = route.ready if route is not None else []
        if not ready:
            raise NotReady(f"model '{name}' has no ready replica")
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
        future = asyncio.get_running_loop().create_future()
        worker.inflight[request_id] = future
        header = messages.request_header(
            request_id, route.index, kind, json_length, deadline, len(body)
        )
        try:
            if worker.requests.push(header, body):
                os.eventfd_write(worker.request_bell, 1)
            else:  # bigger than a slot: its own memfd over the control channel
                worker.post(messages.REQUEST, header, body)
        except OSError:  # it died and its EOF is not handled yet
            worker.inflight.pop(request_id, None)
            return Reply(503, f"{worker.describe()} exited; retry the request".encode())
        try:
            return await future
        except asyncio.CancelledError:
            if worker.alive and request_id in worker.inflight:
                # Its caller went away: the worker drops it if it has not started.
                with contextlib.suppress(OSError):
                    cancel = messages.encode_control({"id": request_id})
                    worker.post(messages.CANCEL, cancel)
            raise
