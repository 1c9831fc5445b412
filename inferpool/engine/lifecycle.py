"""The models' lifecycle in the frontend: start-up, load, reload, unload, readiness.

``Lifecycle`` runs the one start-up (start what runs models, load the repository), the
repository API's load and unload (``load_model`` / ``unload_model``) and what the poll
mode's watcher asks for, one load or unload of a model at a time; it moves each version
through its states in the model table (``states.py``: LOADING, READY, FAILED, UNLOADING,
UNAVAILABLE) and answers the server's readiness (starting up, draining, or the table's).
Where a version actually loads and unloads is the engine client's (``_load`` /
``_unload``: in this process or in the worker pool), looked up at each call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from inferpool.engine.accounting import Accounting
from inferpool.engine.admin import AdminPolicy
from inferpool.engine.pipelines.manager import Pipelines, is_pipeline, load_order
from inferpool.engine.rate_limits import model_bucket
from inferpool.engine.remote_models import RemoteModels
from inferpool.engine.repository import Discovered, discover, find_models
from inferpool.engine.states import (
    UNLOADED,
    ModelKey,
    ModelState,
    ModelStatus,
    ModelTable,
    describe_key,
)
from inferpool.engine.watcher import RepositoryWatcher
from inferpool.errors import BadRequest, InferpoolError, ModelLoadError, ModelNotFound
from inferpool.protocol.endpoints import take_announced
from inferpool.runtimes.registry import RUNTIMES, runtime_name_for
from inferpool.settings import ModelSettings, ServerSettings

if TYPE_CHECKING:
    from inferpool.engine.client import EngineClient

logger = logging.getLogger(__name__)


class StartupFailed(RuntimeError):
    """Models failed to load at start-up and ``exit_on_error`` is set: one reason each."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


class Lifecycle:
    """Loads and unloads one engine client's models, and says whether it is ready."""

    def __init__(
        self,
        settings: ServerSettings,
        table: ModelTable,
        accounting: Accounting,
        pipelines: Pipelines,
        admin: AdminPolicy,
        client: EngineClient,
    ) -> None:
        self.settings = settings
        self.table = table
        self.accounting = accounting
        self.pipelines = pipelines
        self.admin = admin
        self._client = client  # where models run (its _start_workers, _load, _unload)
        self.started = False  # start-up (the repository's first load) has finished
        self.draining = False  # a drain has begun: never ready again, still serving
        self.stopping = False  # shutdown has begun: the engine stops once drained
        # One load or unload of a model (all its versions) at a time. Only names found in
        # the repository or listed in the table get a lock, so a hostile peer cannot grow
        # this.
        self.locks = NamedLocks()
        self.watcher: RepositoryWatcher | None = None  # --model-control-mode poll
        self.remote = RemoteModels(settings)  # models whose uri names a remote object

    # -- readiness ------------------------------------------------------------------------
    def not_ready_reason(self) -> str | None:
        """Why the server is not ready, or None when it is (strict readiness)."""
        if self.draining:
            return "server is shutting down"
        if not self.started:
            return "server is starting up"
        self.pipelines.sync()
        return self.table.not_ready_reason(self.settings.allow_empty)

    def begin_drain(self) -> None:
        """Not ready from now on, for good; requests are still served."""
        self.draining = True

    def begin_shutdown(self) -> bool:
        """Not ready, and stopping from now on; True the first time only."""
        if self.stopping:
            return False
        self.draining = self.stopping = True
        return True

    # -- start-up -------------------------------------------------------------------------
    async def start(self) -> list[ModelStatus]:
        """Start what runs models, load the repository, turn started (see
        ``EngineClient.start``)."""
        await self._client._start_workers()
        statuses = await self.load_repository()
        failed = [status.describe() for status in statuses if status.state is ModelState.FAILED]
        if failed and self.settings.exit_on_error:
            raise StartupFailed(failed)
        self.started = True
        return statuses

    async def stop_watching(self) -> None:
        """Stop following the repository (poll mode)."""
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            await watcher.stop()
        await self.remote.stop()

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
        if poll and repository is not None and self.watcher is None:
            # Started first: what changes while these load is acted on after them.
            debounce = self.settings.repository_debounce
            self.watcher = RepositoryWatcher(self._client, repository, debounce)
            self.watcher.start(found)
            self.remote.start(self.load_discovered)  # remote objects: polled for changes
        # Pipelines load after the models they call, each after the pipelines it calls.
        models = [d for d in found if not is_pipeline(d.settings)]
        statuses = await asyncio.gather(*(self.load_discovered(d, required=True) for d in models))
        pipelines = {id(d.settings): d for d in found if is_pipeline(d.settings)}
        ordered = load_order([d.settings for d in pipelines.values() if d.settings is not None])
        self.pipelines.declare(ordered)
        for settings in ordered:
            statuses.append(await self.load_discovered(pipelines[id(settings)], required=True))
        return list(statuses)

    # -- the repository API ---------------------------------------------------------------
    async def load_model(self, name: str) -> list[ModelStatus]:
        """(Re)load every version of a model the repository holds (see
        ``EngineClient.load_model`` for what each failure answers)."""
        self.admin.require_enabled()
        found = self.held(name)
        if not found:
            if self.table.versions(name):
                async with self.locks.hold(name):
                    for status in self.table.versions(name):
                        if status.state in (ModelState.UNAVAILABLE, ModelState.FAILED):
                            await self.unload_version(status, keep=False)
            raise ModelNotFound(f"model '{name}' is not in the model repository")
        async with self.locks.hold(name):
            statuses = [await self.load_locked(version, False) for version in found]
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
                    await self.unload_version(gone, keep=False)
        if self.watcher is not None:  # poll mode: the watcher follows these folders now
            self.watcher.adopt(found)
        if failed:
            if all(version.settings is None for version in found):
                raise BadRequest(reasons)
            raise ModelLoadError(reasons)
        return statuses

    async def unload_model(self, name: str) -> None:
        """Unload every version of a model in any state (see ``EngineClient.unload_model``)."""
        self.admin.require_enabled()
        self.table.find(name)  # 404 before reading the repository for an unknown name
        try:
            held = {found.key for found in self.held(name)}
        except BadRequest:  # listed under a path (a nested folder that failed): dropped
            held = set()
        await self.unload_named(name, held=held)

    def held(self, name: str) -> list[Discovered]:
        """What the repository holds of the model ``name`` now (400 for a bad name)."""
        repository = self.settings.model_repository
        return find_models(repository, name) if repository is not None else []

    # -- one model's versions -------------------------------------------------------------
    async def unload_named(
        self, name: str, key: ModelKey | None = None, held: set[ModelKey] | None = None
    ) -> None:
        """Unload a listed model's versions, or the one under ``key`` (the API, or poll
        mode when its folder is removed); 404 for a name not listed. Those in ``held``
        (the repository's versions) stay listed as unloaded, the others are dropped."""
        self.table.find(name)  # 404 before taking a lock for an unknown name
        held = held or set()
        async with self.locks.hold(name):
            statuses = [s for s in self.table.versions(name) if key is None or s.key == key]
            forgotten = [s for s in statuses if s.unloaded and s.key not in held]
            for status in statuses:
                await self.unload_version(status, keep=status.key in held)
            if forgotten and len(forgotten) == len(statuses):
                raise ModelNotFound(f"model '{name}' not found")

    async def unload_version(self, status: ModelStatus, keep: bool) -> None:
        """Unload one version; ``keep``: it stays listed as unloaded, else it is dropped."""
        was_loaded = not status.unloaded
        status.state = ModelState.UNLOADING
        try:
            if not self.pipelines.drop(status.key):
                await self._client._unload(status.key)
        finally:
            self.accounting.forget(status.key)
            self.remote.forget(status.key)
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

    async def load_discovered(self, found: Discovered, required: bool = False) -> ModelStatus:
        """Load one version the repository holds, under its model's lock."""
        async with self.locks.hold(found.name):
            return await self.load_locked(found, required)

    async def load_locked(self, found: Discovered, required: bool) -> ModelStatus:
        """Load (or reload) one version, its model's lock held; its new status."""
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
            await self._load(status, settings)
            self.remote.loaded(found)
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

    async def _load(self, status: ModelStatus, settings: ModelSettings) -> None:
        """Load a version where models run (a pipeline: here); READY with its metadata,
        or FAILED with the reason. The load's duration is kept, failed or not."""
        loading = time.perf_counter()
        try:
            if settings.pipeline is not None:
                status.metadata = await self.pipelines.load(settings)
            else:
                # A remote uri: fetched here (in a thread), loaded from its local copy.
                settings = await self.remote.localise(status.key, settings)
                status.metadata = await self._client._load(settings)
                status.endpoints = take_announced(status.metadata)
        except InferpoolError as exc:
            status.state, status.reason = ModelState.FAILED, exc.message
        else:
            status.state, status.reason = ModelState.READY, ""
            status.exchanges_headers = exchanges_headers(settings)
            status.limiter = model_bucket(settings, self.settings)
        finally:
            seconds = time.perf_counter() - loading
            self.accounting.loaded(status.key, seconds, status.state is ModelState.READY)


class NamedLocks:
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


def exchanges_headers(settings: ModelSettings) -> bool:
    """The model's runtime takes the call's headers and may answer some
    (``parameters.headers``): a user's class, or a built-in runtime whose entry says so."""
    try:
        entry = RUNTIMES.get(runtime_name_for(settings))
    except InferpoolError:
        return False
    return entry is None or entry.headers
