"""The one interface frontends talk to, whether models run in-process or in workers.

``EngineClient`` is a facade over the parts that make up the frontend's view of the
models, each in its own module:

- the model table (``states.ModelTable``): which models and versions are listed, their
  states and metadata; ``table``;
- the lifecycle (``lifecycle.py``): start-up, the repository API's load and unload,
  reloads, the poll mode's watcher, readiness; ``lifecycle``;
- the request path (``inference.py``): routing, refusals, deadlines, streams; ``inference``;
- the accounting (``accounting.py``): per-version statistics, for Triton's statistics
  extension and /metrics; ``accounting`` (its tables also as ``stats``, ``buckets``,
  ``load_seconds``).

Subclasses decide where models run: ``_load``, ``_unload``, ``_infer`` (and optionally
``_infer_stream``, ``_start_workers``, ``_on_shutdown``, ``live_reason``).
``make_client`` picks the implementation from the settings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any

from inferpool.engine.accounting import Accounting
from inferpool.engine.admin import AdminPolicy
from inferpool.engine.call_server import CallServer
from inferpool.engine.inference import Inference
from inferpool.engine.ipc.messages import Reply
from inferpool.engine.lifecycle import Lifecycle, StartupFailed
from inferpool.engine.pipelines.manager import Pipelines
from inferpool.engine.shared_memory import SharedMemoryRegistry
from inferpool.engine.states import ModelKey, ModelStatus, ModelTable
from inferpool.errors import InferpoolError
from inferpool.protocol import limits
from inferpool.settings import ModelSettings, ServerSettings

if TYPE_CHECKING:
    from inferpool.engine.pool.pool import PoolClient

__all__ = ["EngineClient", "StartupFailed", "make_client"]


# What a client serving another's models shares with it (``host`` below).
_SHARED_PARTS = (
    "table", "shared_memory", "accounting", "stats", "buckets", "load_seconds", "admin",
    "pipelines", "lifecycle", "call_server", "inference",
)  # fmt: skip


class EngineClient(ABC):
    def __init__(self, settings: ServerSettings, host: EngineClient | None = None) -> None:
        """``host``: the client whose models this one runs some of (``--workers 0``'s
        environment workers, ``environment_workers.py``): its model table, lifecycle,
        statistics and calls are this one's too, so that states, counts and calls between
        models are the same whichever of the two runs a model."""
        self.settings = settings
        if host is not None:
            for part in _SHARED_PARTS:
                setattr(self, part, getattr(host, part))
            return
        # This process's decode limits (workers get theirs when they are forked): the
        # in-process path and what the frontends parse themselves both read them.
        limits.configure(limits.DecodeLimits.from_settings(settings))
        self.table = ModelTable()
        # Triton's system shared-memory regions, registered over REST or gRPC.
        self.shared_memory = SharedMemoryRegistry(
            self.drop_shared_memory, settings.max_shared_memory_regions
        )
        self.accounting = Accounting(settings, self.table)
        # The accounting's tables, under the names /metrics and the endpoints read.
        self.stats = self.accounting.stats
        self.buckets = self.accounting.buckets
        self.load_seconds = self.accounting.load_seconds
        # Read once here (the token file too): a bad admin setting stops the start-up.
        self.admin = AdminPolicy.from_settings(settings)
        self.pipelines = Pipelines(self)  # models whose settings list steps
        self.lifecycle = Lifecycle(
            settings, self.table, self.accounting, self.pipelines, self.admin, self
        )
        self.call_server = CallServer(self)  # runtimes' calls to other models
        self.inference = Inference(
            settings, self.table, self.accounting, self.pipelines, self._infer,
            self._infer_stream, self.overload_refusal,
        )  # fmt: skip

    def drop_shared_memory(self, serials: list[int]) -> None:
        """Unmap unregistered shared-memory regions wherever requests are decoded: this
        process here (``workers=0``); every worker too (``PoolClient``)."""
        from inferpool.engine.worker import shm_regions

        shm_regions.drop(serials)

    def set_log_levels(self, levels: dict[str, int]) -> None:
        """Loggers' new levels (the root's under ""), in every process that logs: this
        one here; the pool's template and workers too (``PoolClient``)."""
        from inferpool import logs

        logs.set_levels(levels)

    # -- health ---------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """``start()`` has loaded the repository (failed models or not)."""
        return self.lifecycle.started

    @property
    def draining(self) -> bool:
        """``begin_drain()`` (or ``begin_shutdown()``) was called: not ready from then on."""
        return self.lifecycle.draining

    @property
    def stopping(self) -> bool:
        """``begin_shutdown()`` was called: no worker is replaced, no request waits for one."""
        return self.lifecycle.stopping

    @property
    def live(self) -> bool:
        return self.live_reason() is None

    def live_reason(self) -> str | None:
        """Why the process is wedged (not live), or None. Draining is still live."""
        return None

    def worker_pool(self) -> PoolClient | None:
        """The worker pool running models, for its metrics (workers, routes, processes):
        the pool itself, ``--workers 0``'s environment workers once started, else None."""
        return None

    def not_ready_reason(self) -> str | None:
        """Why the server is not ready, or None when it is (strict readiness)."""
        return self.lifecycle.not_ready_reason()

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> list[ModelStatus]:
        """The one start-up: start what runs models, load the repository, turn started.

        Returns every model's status. With ``exit_on_error`` a model that failed raises
        ``StartupFailed`` (naming each) and the client stays not started; the caller
        closes it. A missing repository raises ``FileNotFoundError``.
        """
        return await self.lifecycle.start()

    async def _start_workers(self) -> None:  # noqa: B027 - nothing to start in-process
        """Start what runs models (the pool's workers); loads nothing."""

    def begin_drain(self) -> None:
        """A drain begins (SIGTERM): readiness turns false now, for good, while requests
        are still served as before; ``begin_shutdown`` follows once the listeners stop."""
        self.lifecycle.begin_drain()

    def begin_shutdown(self) -> None:
        """Shutdown begins (the listeners stop accepting): not ready, if no drain came
        first; no worker is replaced any more, no request waits for one. Idempotent;
        ``close`` comes after the frontends have drained."""
        if self.lifecycle.begin_shutdown():
            self._on_shutdown()

    def _on_shutdown(self) -> None:  # noqa: B027 - nothing to arm in-process
        """Called once, when shutdown begins (the pool arms its drain deadline here)."""

    async def close(self) -> None:
        """Stop what runs models; in-flight requests must have drained."""
        self.begin_shutdown()
        await self.stop_watching()

    async def stop_watching(self) -> None:
        """Stop following the repository (poll mode); every client's close calls it."""
        await self.lifecycle.stop_watching()

    async def load_repository(self) -> list[ModelStatus]:
        """Load every model in the repository, in parallel; return their statuses.

        These models count for readiness (strict): one that fails keeps the server not
        ready until it loads or is unloaded.
        """
        return await self.lifecycle.load_repository()

    async def load_model(self, name: str) -> list[ModelStatus]:
        """(Re)load every version of a model the repository holds, by name (the
        repository API, in ``explicit`` and ``poll`` modes); listed versions the
        repository no longer holds are dropped.

        The failure goes to the caller: 403 when the API is disabled, 400 for a name or
        settings the server cannot use, 404 for a name the repository does not hold (its
        listed versions that serve nothing are dropped then), 500 (INTERNAL) with the
        reason when a version's load raised or could not be placed. A failed reload keeps
        the version that was serving (still READY, its ``reason`` says the reload failed);
        a new model that fails is listed FAILED but does not make the server not ready.
        """
        return await self.lifecycle.load_model(name)

    async def unload_model(self, name: str) -> None:
        """Unload every version of a model in any state (a FAILED one too). Versions the
        repository still holds stay listed UNAVAILABLE, ``"unloaded"`` (as Triton's);
        the others are dropped. 404 for a name not listed, or listed only as unloaded
        versions the repository no longer holds (they are dropped: Seldon's agent
        takes NOT_FOUND as done)."""
        await self.lifecycle.unload_model(name)

    @abstractmethod
    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        """Load a model where models run; return its metadata or raise with the reason."""

    @abstractmethod
    async def _unload(self, key: ModelKey) -> None:
        """Unload the version under ``key`` from where models run."""

    # -- inference ------------------------------------------------------------------------
    # ``infer`` and ``infer_stream`` hand back the request path's coroutine and generator
    # as they are (awaited and iterated by the caller): no extra frame per request.
    def infer(
        self,
        name: str,
        version: str | None,
        kind: int,
        body: bytes,
        json_length: int | None,
        deadline: float | None = None,
    ) -> Coroutine[Any, Any, Reply]:
        """Run one raw request (``Inference.infer``); routing problems raise, model
        problems come back as a Reply. Counted in the version's statistics."""
        return self.inference.infer(name, version, kind, body, json_length, deadline)

    def infer_stream(
        self,
        name: str,
        version: str | None,
        kind: int,
        body: bytes,
        json_length: int | None,
        deadline: float | None = None,
        more: AsyncIterator[bytes] | None = None,
    ) -> AsyncGenerator[Reply, None]:
        """Run one streamed request (``Inference.infer_stream``): its replies as they come;
        ``more``: the requests a client streams after it (``Kind.GRPC_STREAM_IN``)."""
        return self.inference.infer_stream(name, version, kind, body, json_length, deadline, more)

    def overload_refusal(self, key: ModelKey) -> InferpoolError | None:
        """The refusal a request for ``key`` would meet now where models run because every
        queue that could take it is full, or None (in-process: no queue, never)."""
        return None

    @abstractmethod
    async def _infer(
        self, key: ModelKey, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> Reply: ...

    async def _infer_stream(
        self,
        key: ModelKey,
        kind: int,
        body: bytes,
        json_length: int | None,
        deadline: float | None,
        more: AsyncIterator[bytes] | None = None,
    ) -> AsyncGenerator[Reply, None]:
        """A streamed request's replies where models run (fed ``more``); by default its
        one reply."""
        yield await self._infer(key, kind, body, json_length, deadline)

    # -- statistics -----------------------------------------------------------------------
    def running_requests(self) -> dict[ModelKey, int]:
        """Per model version, its in-flight requests that are running now rather than
        waiting (for a worker, a batch or a replica); the rest are queued. Read at scrape
        time (in-process: ``InProcessClient.running_requests``)."""
        return self.accounting.running()

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics extension (``Accounting.statistics``): every model, one
        model's versions, or one version; 404 unknown, 503 unloaded."""
        return self.accounting.statistics(name, version)


def make_client(settings: ServerSettings) -> EngineClient:
    """The in-process client for ``workers=0``, else the worker pool."""
    if settings.workers <= 0:
        from inferpool.engine.inprocess import InProcessClient

        return InProcessClient(settings)
    from inferpool.engine.pool.pool import PoolClient

    return PoolClient(settings)
