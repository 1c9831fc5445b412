"""The one interface frontends talk to, whether models run in-process or in workers.

``EngineClient`` owns the frontend's view of the models (the ModelTable), readiness and
statistics; subclasses decide where models load and where requests run.
``make_client`` picks the implementation from the settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from inferpool.engine.admin import AdminPolicy
from inferpool.engine.ipc.messages import MORE, Reply, StageTimes
from inferpool.engine.pipelines.manager import Pipelines, is_pipeline, load_order
from inferpool.engine.repository import Discovered, discover, find_models
from inferpool.engine.states import (
    UNLOADED,
    ModelKey,
    ModelState,
    ModelStatus,
    ModelTable,
    describe_key,
)
from inferpool.engine.stats import (
    GRPC,
    PROTOCOL_OF_KIND,
    Buckets,
    ModelStats,
    error_reason,
    reply_reason,
)
from inferpool.engine.watcher import RepositoryWatcher
from inferpool.errors import (
    BadRequest,
    DeadlineExceeded,
    InferpoolError,
    ModelLoadError,
    ModelNotFound,
    NotReady,
)
from inferpool.protocol import limits
from inferpool.protocol.endpoints import take_announced
from inferpool.runtimes.registry import RUNTIMES, runtime_name_for
from inferpool.settings import ModelSettings, ServerSettings

logger = logging.getLogger(__name__)

# Seconds by which a deadline's timer may fire early (uvloop's timers are in milliseconds).
_TIMER_SLACK = 0.002


class EngineClient(ABC):
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        # This process's decode limits (workers get theirs when they are forked): the
        # in-process path and what the frontends parse themselves both read them.
        limits.configure(limits.DecodeLimits.from_settings(settings))
        self.table = ModelTable()
        self.stats: dict[ModelKey, ModelStats] = {}  # per version
        self.buckets = Buckets(
            tuple(settings.metrics_latency_buckets), tuple(settings.metrics_batch_buckets)
        )
        # Per version, the seconds its last load took (failed or not), for /metrics.
        self.load_seconds: dict[ModelKey, float] = {}
        # A 503 reply made in this process means that a worker died with the request.
        self._workers = settings.workers > 0
        self._started = False  # start-up (the repository's first load) has finished
        self._draining = False  # a drain has begun: never ready again, still serving
        self._stopping = False  # shutdown has begun: the engine stops once drained
        # Read once here (the token file too): a bad admin setting stops the start-up.
        self.admin = AdminPolicy.from_settings(settings)
        # One load or unload of a model (all its versions) at a time. Only names found in
        # the repository or listed in the table get a lock, so a hostile peer cannot grow
        # this.
        self._locks = _NamedLocks()
        self._watcher: RepositoryWatcher | None = None  # --model-control-mode poll
        self.pipelines = Pipelines(self)  # models whose settings list steps

    # -- health ---------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """``start()`` has loaded the repository (failed models or not)."""
        return self._started

    @property
    def draining(self) -> bool:
        """``begin_drain()`` (or ``begin_shutdown()``) was called: not ready from then on."""
        return self._draining

    @property
    def stopping(self) -> bool:
        """``begin_shutdown()`` was called: no worker is replaced, no request waits for one."""
        return self._stopping

    @property
    def live(self) -> bool:
        return self.live_reason() is None

    def live_reason(self) -> str | None:
        """Why the process is wedged (not live), or None. Draining is still live."""
        return None

    def not_ready_reason(self) -> str | None:
        """Why the server is not ready, or None when it is (strict readiness)."""
        if self._draining:
            return "server is shutting down"
        if not self.started:
            return "server is starting up"
        self.pipelines.sync()
        return self.table.not_ready_reason(self.settings.allow_empty)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> list[ModelStatus]:
        """The one start-up: start what runs models, load the repository, turn started.

        Returns every model's status. With ``exit_on_error`` a model that failed raises
        ``StartupFailed`` (naming each) and the client stays not started; the caller
        closes it. A missing repository raises ``FileNotFoundError``.
        """
        await self._start_workers()
        statuses = await self.load_repository()
        failed = [status.describe() for status in statuses if status.state is ModelState.FAILED]
        if failed and self.settings.exit_on_error:
            raise StartupFailed(failed)
        self._started = True
        return statuses

    async def _start_workers(self) -> None:  # noqa: B027 - nothing to start in-process
        """Start what runs models (the pool's workers); loads nothing."""

    def begin_drain(self) -> None:
        """A drain begins (SIGTERM): readiness turns false now, for good, while requests
        are still served as before; ``begin_shutdown`` follows once the listeners stop."""
        self._draining = True

    def begin_shutdown(self) -> None:
        """Shutdown begins (the listeners stop accepting): not ready, if no drain came
        first; no worker is replaced any more, no request waits for one. Idempotent;
        ``close`` comes after the frontends have drained."""
        if self._stopping:
            return
        self._draining = self._stopping = True
        self._on_shutdown()

    def _on_shutdown(self) -> None:  # noqa: B027 - nothing to arm in-process
        """Called once, when shutdown begins (the pool arms its drain deadline here)."""

    async def close(self) -> None:
        """Stop what runs models; in-flight requests must have drained."""
        self.begin_shutdown()
        await self.stop_watching()

    async def stop_watching(self) -> None:
        """Stop following the repository (poll mode); every client's close calls it."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await watcher.stop()

    async def load_repository(self) -> list[ModelStatus]:
        """Load every model in the repository, in parallel; return their statuses.

        These models count for readiness (strict): one that fails keeps the server not
        ready until it loads or is unloaded.
        """
        repository = self.settings.model_repository
        found = []  # without loading at start-up, the repository API loads
        if repository is not None and self.settings.load_models_at_startup:
            found = discover(repository)
        poll = self.settings.model_control_mode == "poll"
        if poll and repository is not None and self._watcher is None:
            # Started first: what changes while these load is acted on after them.
            self._watcher = RepositoryWatcher(self, repository, self.settings.repository_debounce)
            self._watcher.start(found)
        # Pipelines load after the models they call, each after the pipelines it calls.
        models = [d for d in found if not is_pipeline(d.settings)]
        statuses = await asyncio.gather(*(self._load_discovered(d, required=True) for d in models))
        pipelines = {id(d.settings): d for d in found if is_pipeline(d.settings)}
        ordered = load_order([d.settings for d in pipelines.values() if d.settings is not None])
        self.pipelines.declare(ordered)
        for settings in ordered:
            statuses.append(await self._load_discovered(pipelines[id(settings)], required=True))
        return list(statuses)

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
        self.admin.require_enabled()
        found = self._held(name)
        if not found:
            if self.table.versions(name):
                async with self._locks.hold(name):
                    for status in self.table.versions(name):
                        if status.state in (ModelState.UNAVAILABLE, ModelState.FAILED):
                            await self._unload_version(status, keep=False)
            raise ModelNotFound(f"model '{name}' is not in the model repository")
        async with self._locks.hold(name):
            statuses = [await self._load_locked(version, False) for version in found]
            failed = [status for status in statuses if status.state is not ModelState.READY]
            reasons = "; ".join(status.describe() for status in failed)
            held = {version.key for version in found}
            for gone in self.table.versions(name):
                if gone.key in held:
                    continue
                if failed and gone.state is ModelState.READY:
                    # Replaced by versions that failed: it keeps serving meanwhile.
                    gone.reason = "reload failed: " + "; ".join(f.reason for f in failed)
                else:
                    await self._unload_version(gone, keep=False)
        if self._watcher is not None:  # poll mode: the watcher follows these folders now
            self._watcher.adopt(found)
        if failed:
            if all(version.settings is None for version in found):
                raise BadRequest(reasons)
            raise ModelLoadError(reasons)
        return statuses

    async def unload_model(self, name: str) -> None:
        """Unload every version of a model in any state (a FAILED one too). Versions the
        repository still holds stay listed UNAVAILABLE, ``"unloaded"`` (as Triton's);
        the others are dropped. 404 for a name not listed, or listed only as unloaded
        versions the repository no longer holds (they are dropped: Seldon's agent
        takes NOT_FOUND as done)."""
        self.admin.require_enabled()
        self.table.find(name)  # 404 before reading the repository for an unknown name
        try:
            held = {found.key for found in self._held(name)}
        except BadRequest:  # listed under a path (a nested folder that failed): dropped
            held = set()
        await self._unload_named(name, held=held)

    def _held(self, name: str) -> list[Discovered]:
        """What the repository holds of the model ``name`` now (400 for a bad name)."""
        repository = self.settings.model_repository
        return find_models(repository, name) if repository is not None else []

    async def _unload_named(
        self, name: str, key: ModelKey | None = None, held: set[ModelKey] | None = None
    ) -> None:
        """Unload a listed model's versions, or the one under ``key`` (the API, or poll
        mode when its folder is removed); 404 for a name not listed. Those in ``held``
        (the repository's versions) stay listed as unloaded, the others are dropped."""
        self.table.find(name)  # 404 before taking a lock for an unknown name
        held = held or set()
        async with self._locks.hold(name):
            statuses = [s for s in self.table.versions(name) if key is None or s.key == key]
            forgotten = [s for s in statuses if s.unloaded and s.key not in held]
            for status in statuses:
                await self._unload_version(status, keep=status.key in held)
            if forgotten and len(forgotten) == len(statuses):
                raise ModelNotFound(f"model '{name}' not found")

    async def _unload_version(self, status: ModelStatus, keep: bool) -> None:
        """Unload one version; ``keep``: it stays listed as unloaded, else it is dropped."""
        was_loaded = not status.unloaded
        status.state = ModelState.UNLOADING
        try:
            if not self.pipelines.drop(status.key):
                await self._unload(status.key)
        finally:
            self.stats.pop(status.key, None)
            self.load_seconds.pop(status.key, None)
            if keep:
                status.state, status.reason, status.required = (
                    ModelState.UNAVAILABLE,
                    UNLOADED,
                    False,
                )
            else:
                self.table.remove(status.key)
        if was_loaded:
            logger.info("%s unloaded", describe_key(status.key))

    async def _load_discovered(self, found: Discovered, required: bool = False) -> ModelStatus:
        async with self._locks.hold(found.name):
            return await self._load_locked(found, required)

    async def _load_locked(self, found: Discovered, required: bool) -> ModelStatus:
        previous = self.table.get(found.key)
        serving = previous is not None and previous.state is ModelState.READY
        required = required or (previous is not None and previous.required)
        settings = found.settings
        if settings is None:
            status = ModelStatus(found.name, None, ModelState.FAILED, found.error)
        else:
            status = ModelStatus(
                settings.name, settings.version, ModelState.LOADING, settings=settings
            )
            if not serving:  # a reload leaves the serving version listed until it succeeds
                status.required = required
                self.table.set(status)
            loading = time.perf_counter()
            try:
                if settings.pipeline is not None:
                    status.metadata = await self.pipelines.load(settings)
                else:
                    status.metadata = await self._load(settings)
                    status.endpoints = take_announced(status.metadata)
            except InferpoolError as exc:
                status.state, status.reason = ModelState.FAILED, exc.message
            else:
                status.state, status.reason = ModelState.READY, ""
                status.custom = is_custom(settings)
                self.stats.setdefault(status.key, ModelStats(self.buckets))
            finally:
                self.load_seconds[status.key] = time.perf_counter() - loading
        if status.state is ModelState.READY:
            status.required = True  # it has served: from now on it counts for readiness
            self.table.set(status)
            logger.info("%s is %s", describe_key(status.key), "reloaded" if serving else "ready")
        elif serving:
            # The previous version keeps serving (the engine keeps its replicas until a
            # new version is placed); the index and metadata say that the reload failed.
            assert previous is not None
            previous.reason = f"reload failed: {status.reason}"
            logger.error(
                "%s failed to reload (the previous version keeps serving): %s",
                describe_key(status.key),
                status.reason,
            )
        else:
            status.required = required
            self.table.set(status)
            logger.error("%s failed to load: %s", describe_key(status.key), status.reason)
        return status

    @abstractmethod
    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        """Load a model where models run; return its metadata or raise with the reason."""

    @abstractmethod
    async def _unload(self, key: ModelKey) -> None:
        """Unload the version under ``key`` from where models run."""

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
        Linux): a request still waiting then is dropped before it reaches a model. Every
        outcome is counted in the version's statistics, except a 404 (no version to count
        it for).
        """
        status = self.table.find(name, version)
        key = status.key
        stats = self._stats_of(key)
        protocol = PROTOCOL_OF_KIND[kind]
        started = time.perf_counter_ns()
        stats.in_flight += 1  # the in-flight gauge: in until answered, refused or cancelled
        plan = self.pipelines.plans.get(key)
        try:
            if plan is not None:
                self.pipelines.sync()  # its readiness follows its children's
            if status.state is not ModelState.READY:
                raise status.refusal() if plan is None else self.pipelines.refusal(plan, status)
            check_deadline(deadline)
            if plan is None:
                reply = await self._infer(key, kind, body, json_length, deadline)
            else:
                reply = await self.pipelines.infer(plan, kind, body, json_length, deadline)
        except asyncio.CancelledError:
            # The frontend gave up on it: at its deadline (it answers 504), else because
            # the client went away (499). The deadline's timer is uvloop's, in whole
            # milliseconds: it may fire a hair before the deadline itself.
            late = deadline is not None and time.monotonic() >= deadline - _TIMER_SLACK
            stats.refuse(protocol, 504 if late else 499, "timeout" if late else "cancelled")
            raise
        except Exception as exc:
            code = exc.status if isinstance(exc, InferpoolError) else 500
            stats.refuse(protocol, code, error_reason(exc))
            raise
        finally:
            stats.in_flight -= 1
        self._count_reply(stats, protocol, reply, started)
        return reply

    def _stats_of(self, key: ModelKey) -> ModelStats:
        """The version's statistics (a version that is not READY gets them here; a READY
        one has them)."""
        stats = self.stats.get(key)
        if stats is None:
            stats = self.stats[key] = ModelStats(self.buckets)
        return stats

    def _count_reply(self, stats: ModelStats, protocol: int, reply: Reply, started: int) -> None:
        """Count a request's (or a stream's last) reply, ``started`` at that
        ``perf_counter_ns``."""
        elapsed = time.perf_counter_ns() - started
        code = reply.status
        reason = "" if code < 400 else reply_reason(reply, self._workers)
        stats.record(protocol, code, elapsed, reply.times, reply.rows, reply.execution, reason)

    async def infer_stream(
        self,
        name: str,
        version: str | None,
        kind: int,
        body: bytes,
        json_length: int | None,
        deadline: float | None = None,
    ) -> AsyncGenerator[Reply, None]:
        """Run one streamed request (a ``STREAM_KINDS`` kind): its replies as they come.

        Each chunk of a runtime's ``predict_stream`` is a 200 marked ``MORE``; the last
        reply is an empty 200, or the error that ended the stream. A model that does not
        stream answers with its one reply (unmarked). Routing problems raise before the
        first reply. A model that takes longer than its timeout (``timeout``, else the
        server's ``model_timeout``) to produce a chunk ends the stream with a 504, and its
        generator is closed, as it is when the caller stops iterating. Counted once in the
        version's statistics, when the stream ends.
        """
        status = self.table.find(name, version)
        key = status.key
        stats = self._stats_of(key)
        protocol = PROTOCOL_OF_KIND[kind]
        if status.state is not ModelState.READY:
            refusal = status.refusal()
            stats.refuse(protocol, refusal.status, error_reason(refusal))
            raise refusal
        check_deadline(deadline)
        timeout = self._chunk_timeout(status)
        started = time.perf_counter_ns()
        stats.in_flight += 1
        replies = self._infer_stream(key, kind, body, json_length, deadline)
        last: Reply | None = None
        try:
            while True:
                try:
                    async with asyncio.timeout(timeout):
                        reply = await anext(replies)
                except TimeoutError:
                    reply = Reply.from_error(
                        DeadlineExceeded(
                            f"{describe_key(key)} produced no chunk within its timeout "
                            f"({timeout:g} s)"
                        )
                    )
                except StopAsyncIteration:
                    break
                last = reply
                yield reply
                if not reply.flags & MORE:
                    break
        finally:
            stats.in_flight -= 1
            await replies.aclose()
            if last is None or last.flags & MORE:  # it never ended: the caller went away
                stats.refuse(protocol, 499, "cancelled")
            else:
                self._count_reply(stats, protocol, last, started)

    def _chunk_timeout(self, status: ModelStatus) -> float | None:
        """Seconds a stream's model may take per chunk (None: no limit)."""
        settings = status.settings
        timeout = settings.timeout if settings is not None else None
        if timeout is None:
            timeout = self.settings.model_timeout
        return timeout if timeout > 0 else None

    async def _infer_stream(
        self, key: ModelKey, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> AsyncGenerator[Reply, None]:
        """A streamed request's replies where models run; by default its one reply."""
        yield await self._infer(key, kind, body, json_length, deadline)

    def running_requests(self) -> dict[ModelKey, int]:
        """Per model version, its in-flight requests that are running now rather than
        waiting (for a worker, a batch or a replica); the rest are queued. Read at scrape
        time (in-process: ``InProcessClient.running_requests``)."""
        return {key: stats.in_flight for key, stats in self.stats.items() if stats.in_flight}

    def _record(
        self,
        name: str,
        ok: bool,
        started: int,
        times: StageTimes | None,
        rows: int = 1,
        execution: int = 1,
        error: BaseException | None = None,
    ) -> None:
        """Count a request of ``rows`` inferences that began at ``started`` (perf_counter_ns)
        and ran in an execution of ``execution`` rows (``Reply.execution``), or failed with
        ``error``, in its model's statistics (none once the model is unloaded). The typed
        path of the embedded Engine counts as gRPC, the wire format it takes with workers."""
        stats = self.stats.get(name)
        if stats is None:
            return
        elapsed = time.perf_counter_ns() - started
        if ok:
            stats.record(GRPC, 200, elapsed, times, rows, execution)
        else:
            code = error.status if isinstance(error, InferpoolError) else 500
            reason = "internal" if error is None else error_reason(error)
            stats.record(GRPC, code, elapsed, times, rows, execution, reason)

    @abstractmethod
    async def _infer(
        self, key: ModelKey, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> Reply: ...

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics extension: every model, one model's versions (all of them
        when ``version`` is None, as Triton), or one version. Unloaded versions have none
        (as Triton, which counts loaded models only): left out of the lists, 503 when
        named (or when every version of the model named is unloaded)."""
        if name and version is None:
            listed = self.table.versions(name) or [self.table.find(name)]  # 404 if unknown
            statuses = [s for s in listed if not s.unloaded]
            if not statuses:
                raise NotReady(listed[0].describe())
        elif name:
            status = self.table.find(name, version)
            if status.unloaded:
                raise NotReady(status.describe())
            statuses = [status]
        else:
            statuses = [s for s in self.table.all() if not s.unloaded]
        return {
            "model_stats": [
                self.stats.get(s.key, ModelStats(self.buckets)).to_triton(s.name, s.version)
                for s in statuses
            ]
        }


class StartupFailed(RuntimeError):
    """Models failed to load at start-up and ``exit_on_error`` is set: one reason each."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


class _NamedLocks:
    """One asyncio lock per name, kept only while some task holds or awaits it."""

    def __init__(self) -> None:
        self._entries: dict[str, list[Any]] = {}  # name -> [lock, tasks holding or waiting]

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        entry = self._entries.setdefault(name, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._entries[name]

    def __len__(self) -> int:
        return len(self._entries)


def is_custom(settings: ModelSettings) -> bool:
    """The model's runtime is not one of inferpool's own (a user's class)."""
    try:
        return runtime_name_for(settings) not in RUNTIMES
    except InferpoolError:
        return False


def check_deadline(deadline: float | None) -> None:
    """Refuse a request whose deadline has passed (504 / DEADLINE_EXCEEDED)."""
    if deadline is not None and time.monotonic() > deadline:
        raise DeadlineExceeded("the request's deadline passed before it could run")


def make_client(settings: ServerSettings) -> EngineClient:
    """The in-process client for ``workers=0``, else the worker pool."""
    if settings.workers <= 0:
        from inferpool.engine.inprocess import InProcessClient

        return InProcessClient(settings)
    from inferpool.engine.pool.pool import PoolClient

    return PoolClient(settings)
