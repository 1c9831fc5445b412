"""The worker pool: the ``EngineClient`` for ``workers > 0``, composed of three parts.

- ``supervisor.py``: the template process (kept by ``template_keeper.py``) and the
  workers (spawn, replacement, retirement, shutdown), with ``watchdog.py`` (heartbeats,
  timeouts, wedged), ``crash_blame.py`` (exit statuses, quarantine counts) and
  ``roster.py`` (the worker groups, and those started for an environment);
- ``dispatch.py``: the routes and each request's way to the least-loaded replica;
- ``placement.py``: loading a model's replicas where there is room, unloading, and
  loading again on a worker that replaced a dead one;
- ``generations.py``: models the template loads and shares, brought to the workers by a
  new generation of workers when the current one was forked without them;
- ``recycling.py``: a worker past its request count or memory, replaced by a fresh one.
- ``stalls.py``: workers stalled by a long call take no new requests, and standby
  workers serve the other models meanwhile.

``PoolClient`` wires them together: it is the ``PoolEvents`` the supervisor reports to
("worker lost", "worker replaced: reload its models", "quarantine this model"), and it
keeps the model table's states in step (a model quarantined is FAILED; one whose every
replica is being replaced stays READY for ``REPLICA_WAIT``, then turns LOADING).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from inferpool.engine.client import EngineClient
from inferpool.engine.ipc import messages
from inferpool.engine.ipc.call_ops import Call, CallReply
from inferpool.engine.ipc.messages import Reply
from inferpool.engine.ipc.shared_memory import DropRegions
from inferpool.engine.pool.dispatch import Dispatcher, Route
from inferpool.engine.pool.generations import Generations
from inferpool.engine.pool.groups import names_environment
from inferpool.engine.pool.handles import Answer, WorkerHandle
from inferpool.engine.pool.placement import Placement, set_state
from inferpool.engine.pool.recycling import Recycler
from inferpool.engine.pool.stalls import Stalls
from inferpool.engine.pool.supervisor import Supervisor
from inferpool.engine.states import ModelKey, ModelState, model_key, model_label
from inferpool.errors import InferpoolError
from inferpool.request_ids import resolve_internal
from inferpool.settings import ModelSettings, ServerSettings

logger = logging.getLogger(__name__)


class PoolClient(EngineClient):
    def __init__(self, settings: ServerSettings, host: EngineClient | None = None) -> None:
        super().__init__(settings, host)
        self.supervisor = Supervisor(settings, self, lambda: self.stopping)
        # Queued requests wait up to max_queue per worker; a pool of environment groups
        # only (``--workers 0``'s, under ``host``) counts a group's workers.
        workers = settings.workers or settings.environment_workers
        self.dispatcher = Dispatcher(
            self.table, max(1, settings.max_queue), workers, lambda: self.stopping
        )
        supervisor = self.supervisor
        self.placement = Placement(
            settings, self.table, self.dispatcher, supervisor.alive, supervisor.roster,
            supervisor.blame.exit_status,
        )  # fmt: skip
        self.generations = Generations(self.supervisor, self.placement, self.dispatcher)
        self.recycler = Recycler(
            settings, self.supervisor, self.generations, self.placement, self.dispatcher
        )
        self.stalls = Stalls(settings, self.supervisor, self.dispatcher, self.placement)
        self._stop_deadline: float | None = None
        self._closed = False
        self._calls: set[asyncio.Future[None]] = set()  # runtimes' calls being served

    # -- what metrics and tests read ---------------------------------------------------------
    @property
    def workers(self) -> list[WorkerHandle | None]:
        return self.supervisor.workers

    @property
    def routes(self) -> dict[ModelKey, Route]:
        return self.dispatcher.routes

    @property
    def template_restarts(self) -> int:
        return self.supervisor.template_restarts

    @property
    def worker_restarts(self) -> int:
        return self.supervisor.worker_restarts

    @property
    def wedged(self) -> str | None:
        return self.supervisor.wedged

    def running_requests(self) -> dict[ModelKey, int]:
        supervisor = self.supervisor
        return self.dispatcher.running([*supervisor.workers, *supervisor.retiring,
                                        *supervisor.standby])  # fmt: skip

    def worker_pool(self) -> PoolClient:
        return self

    def live_reason(self) -> str | None:
        if self._closed:
            return "the worker pool is closed"
        return self.supervisor.wedged

    def drop_shared_memory(self, serials: list[int]) -> None:
        """Every live worker unmaps them (a worker started later never mapped them)."""
        message = DropRegions(serials=serials)
        for worker in self.supervisor.supervised():
            worker.post_control(message)

    def set_log_levels(self, levels: dict[str, int]) -> None:
        """Here, then in every template (workers forked later inherit its levels) and in
        every live worker, as a control message each."""
        super().set_log_levels(levels)
        message = messages.LogLevels(levels=levels)
        roster = self.supervisor.roster
        keepers = {id(g.keeper): g.keeper for g in (*roster.groups, *roster.environments.values())}
        for keeper in keepers.values():
            template = keeper.template
            if template is not None:
                with contextlib.suppress(OSError):  # it died: a restart reads the new levels
                    template.channel.send_control(message)
        for worker in self.supervisor.supervised():
            worker.post_control(message)

    # -- lifecycle -------------------------------------------------------------------------
    async def _start_workers(self) -> None:
        await self.supervisor.start()

    def _on_shutdown(self) -> None:
        # The drain and the workers' stop share one deadline, and a request still hung
        # near its end has its worker killed.
        self._stop_deadline = time.monotonic() + self.settings.shutdown_timeout
        self.supervisor.watchdog.arm(self._stop_deadline)
        self.dispatcher.wake_all()  # no replica comes back now

    async def close(self) -> None:
        self.begin_shutdown()
        await self.stop_watching()  # poll mode: no load starts while the pool stops
        await self.supervisor.stop(self._stop_deadline or time.monotonic())
        self._closed = True

    # -- models and requests ---------------------------------------------------------------
    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        await self.supervisor.roster.group_for(settings)  # its environment's workers, started
        metadata = await self.generations.load(settings)
        # Loaded again: a quarantine is lifted.
        key = model_key(settings.name, settings.version)
        self.supervisor.blame.crashes.forget(model_label(key))
        return metadata

    async def _unload(self, key: ModelKey) -> None:
        route = self.dispatcher.routes.get(key)
        if route is not None:
            self.placement.remove(route)
        if self.supervisor.template is not None:  # no worker holds it now
            self.supervisor.template.unpreload(key)
        self.supervisor.blame.crashes.forget(model_label(key))

    def overload_refusal(self, key: ModelKey) -> InferpoolError | None:
        return self.dispatcher.refusal(key)

    async def _infer(
        self, key: ModelKey, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> Reply:
        return await self.dispatcher.infer(key, kind, body, json_length, deadline)

    async def _infer_stream(
        self,
        key: ModelKey,
        kind: int,
        body: bytes,
        json_length: int | None,
        deadline: float | None,
        more: AsyncIterator[bytes] | None = None,
    ) -> AsyncGenerator[Reply, None]:
        replies = self.dispatcher.stream(key, kind, body, json_length, deadline, more)
        try:
            async for reply in replies:
                yield reply
        finally:
            await replies.aclose()

    # -- what the supervisor reports (PoolEvents) --------------------------------------------
    def timeout_of(self, model_index: int) -> float:
        route = self.dispatcher.route_of(model_index)
        if route is not None:
            return route.timeout
        return self.settings.model_timeout if self.settings.model_timeout > 0 else 0.0

    def model_name(self, model_index: int) -> str | None:
        route = self.dispatcher.route_of(model_index)
        return route.label if route is not None else None

    def worker_lost(self, worker: WorkerHandle) -> None:
        self.dispatcher.worker_lost(worker)

    async def worker_replaced(self, worker: WorkerHandle) -> None:
        await self.placement.reload(worker)

    def serve_call(self, worker: WorkerHandle, message: Call, answer: Answer) -> None:
        task = asyncio.ensure_future(self._answer_call(worker, message, answer))
        self._calls.add(task)  # (a task nobody holds may be collected before it ends)
        task.add_done_callback(self._calls.discard)

    async def _answer_call(self, worker: WorkerHandle, message: Call, answer: Answer) -> None:
        parents = [resolve_internal(request_id) for request_id in message.parents]
        json_length = None if message.json_length < 0 else message.json_length
        status, body, answer_json = await self.call_server.serve(
            message.model, message.version, message.body, json_length, message.caller, parents,
            message.timeout,
        )  # fmt: skip
        reply = CallReply(
            call_id=message.call_id, status=status, body=body,
            json_length=-1 if answer_json is None else answer_json,
        )  # fmt: skip
        if worker.alive:  # else it died meanwhile: nobody waits for the answer
            with contextlib.suppress(OSError):
                answer(reply)

    def shared_documents(self) -> list[dict[str, Any]]:
        documents = [route.settings.model_dump(mode="json") for route in self.routes.values()]
        server = self.settings.environment_tarball
        return [document for document in documents if not names_environment(document, server)]

    def quarantine(self, model_index: int, reason: str) -> None:
        route = self.dispatcher.route_of(model_index)
        if route is None:
            return
        logger.error("%s is %s", route.describe(), reason)
        self.placement.remove(route)
        status = self.table.get(route.key)
        if status is not None:
            status.state, status.reason = ModelState.FAILED, reason
            # One client's poisonous input must not take the whole server out of its
            # Service: the other models keep the server ready. Loading the model again
            # (and serving) makes it count again.
            status.required = False

    def tick(self, now: float) -> None:
        self.recycler.tick(now)
        self.stalls.tick(now)
        for key in self.dispatcher.waited_too_long(now):
            set_state(self.table, key, ModelState.LOADING, "reloading: its workers restarted")
