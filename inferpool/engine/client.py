"""The one interface frontends talk to, whether models run in-process or in workers.

``EngineClient`` owns the frontend's view of the models (the ModelTable), readiness and
statistics; subclasses decide where models load and where requests run.
``make_client`` picks the implementation from the settings.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

from inferpool.engine.handler import Reply
from inferpool.engine.repository import Discovered, discover, find_model
from inferpool.engine.states import ModelState, ModelStatus, ModelTable
from inferpool.engine.stats import ModelStats
from inferpool.errors import DeadlineExceeded, InferpoolError, ModelNotFound
from inferpool.protocol import limits
from inferpool.settings import ModelSettings, ServerSettings

logger = logging.getLogger(__name__)


class EngineClient(ABC):
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.table = ModelTable()
        self.stats: dict[str, ModelStats] = {}
        self.started = False  # start-up (repository load) has finished
        self.stopping = False

    # -- health ---------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        return not self.stopping

    def not_ready_reason(self) -> str | None:
        """Why the server is not ready, or None when it is (strict readiness)."""
        if self.stopping:
            return "server is shutting down"
        if not self.started:
            return "server is starting up"
        return self.table.not_ready_reason(self.settings.allow_empty)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:  # noqa: B027 - nothing to start in-process
        """Start what runs models (workers); loads nothing."""

    async def close(self) -> None:  # noqa: B027
        """Stop what runs models; in-flight requests must have drained."""

    async def load_repository(self) -> list[ModelStatus]:
        """Load every model in the repository, in parallel; return their statuses."""
        repository = self.settings.model_repository
        found = discover(repository) if repository is not None else []
        return list(await asyncio.gather(*(self._load_discovered(d) for d in found)))

    async def load_model(self, name: str) -> ModelStatus:
        """(Re)load a model from the repository by name (the repository API)."""
        repository = self.settings.model_repository
        found = find_model(repository, name) if repository is not None else None
        if found is None:
            raise ModelNotFound(f"model '{name}' is not in the model repository")
        status = await self._load_discovered(found)
        if status.state is not ModelState.READY:
            raise InferpoolError(status.describe())
        return status

    async def unload_model(self, name: str) -> None:
        status = self.table.find(name)
        status.state = ModelState.UNLOADING
        await self._unload(name)
        self.table.remove(name)
        self.stats.pop(name, None)

    async def _load_discovered(self, found: Discovered) -> ModelStatus:
        if found.settings is None:
            status = ModelStatus(found.name, None, ModelState.FAILED, found.error)
            self.table.set(status)
            return status
        settings = found.settings
        status = ModelStatus(settings.name, settings.version, ModelState.LOADING)
        self.table.set(status)
        try:
            status.metadata = await self._load(settings)
        except InferpoolError as exc:
            status.state, status.reason = ModelState.FAILED, exc.message
        else:
            status.state, status.reason = ModelState.READY, ""
            self.stats.setdefault(settings.name, ModelStats())
        if status.state is ModelState.FAILED:
            logger.error("model '%s' failed to load: %s", status.name, status.reason)
        else:
            logger.info("model '%s' is ready", status.name)
        return status

    @abstractmethod
    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        """Load a model where models run; return its metadata or raise with the reason."""

    @abstractmethod
    async def _unload(self, name: str) -> None: ...

    # -- inference ------------------------------------------------------------------------
    async def infer(
        self,
        name: str,
        version: str | None,
        kind: int,
        body: bytes,
        json_length: int | None,
        deadline: float | None = None,
    ) -> Reply:
        """Run one raw request; routing problems raise, model problems come back as a Reply.

        ``deadline`` is a ``time.monotonic()`` instant (the same clock in every process on
        Linux): a request still waiting then is dropped before it reaches a model.
        """
        self.table.ready_model(name, version)
        check_deadline(deadline)
        started = time.perf_counter_ns()
        reply = await self._infer(name, kind, body, json_length, deadline)
        stats = self.stats.get(name)
        if stats is not None:
            stats.record(reply.status == 200, time.perf_counter_ns() - started, reply.times)
        return reply

    @abstractmethod
    async def _infer(
        self, name: str, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> Reply: ...

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics extension: every model, or one."""
        statuses = [self.table.find(name, version)] if name else self.table.all()
        return {
            "model_stats": [
                self.stats.get(s.name, ModelStats()).to_triton(s.name, s.version) for s in statuses
            ]
        }


class InProcessClient(EngineClient):
    """``workers=0``: models load and predict in the frontend process (embedding, debug)."""

    def __init__(self, settings: ServerSettings) -> None:
        super().__init__(settings)
        from inferpool.engine.model import LoadedModel

        limits.configure(limits.DecodeLimits.from_settings(settings))
        self.models: dict[str, LoadedModel] = {}

    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        from inferpool.engine.model import failure_reason

        try:
            # A thread keeps the loop answering health checks while a model loads.
            model = await asyncio.to_thread(_load_one_at_a_time, settings)
        except Exception as exc:
            raise InferpoolError(failure_reason(exc)) from None
        self.models[settings.name] = model
        predictor = model.runtime.predictor()
        if predictor:
            logger.info("model '%s': predicted by %s", settings.name, predictor)
        return model.metadata

    async def _unload(self, name: str) -> None:
        self.models.pop(name, None)

    async def _infer(
        self, name: str, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> Reply:
        from inferpool.engine.handler import handle

        return handle(self.models[name], kind, body, json_length)


# Loads run in a thread (the loop keeps answering health checks), one at a time: a
# library's first import can happen inside any load (importing a runtime module,
# unpickling, a user's load()), and two threads importing one library at once see it
# half-initialised (sklearn: ImportError) or deadlock (LightGBM). Worker processes load
# one model at a time anyway.
_LOAD_LOCK = threading.Lock()


def _load_one_at_a_time(settings: ModelSettings) -> Any:
    from inferpool.engine.model import load_model

    with _LOAD_LOCK:
        return load_model(settings)


def check_deadline(deadline: float | None) -> None:
    """Refuse a request whose deadline has passed (504 / DEADLINE_EXCEEDED)."""
    if deadline is not None and time.monotonic() > deadline:
        raise DeadlineExceeded("the request's deadline passed before it could run")


def make_client(settings: ServerSettings) -> EngineClient:
    """The in-process client for ``workers=0``, else the worker pool."""
    if settings.workers <= 0:
        return InProcessClient(settings)
    from inferpool.engine.pool import PoolClient

    return PoolClient(settings)
