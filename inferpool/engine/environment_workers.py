"""``--workers 0``'s environment workers: the models that name an environment of their own.

Such a model (``parameters.environment_tarball``, MLServer's key, or
``parameters.environment_path``) needs its environment's interpreter: alibi's explainers
and detectors, for one, need numpy 1 beside the server's numpy 2. With ``--workers 0``
every other model loads in the server process; these go to a worker pool of their own
(``PoolClient`` with no worker of the server's: one group per environment,
``environment_workers`` workers each, started when the first model naming it loads),
which shares the in-process client's model table, lifecycle, statistics and calls. So
an explainer in an environment worker calls a model loaded in the server process
through the engine, and both are listed, counted and unloaded as any other.

The in-process client's collaborator: it calls the pool's ``_load``, ``_unload``,
``_infer`` (through ``pool_of``) and ``_on_shutdown`` as the pool's own
``EngineClient`` methods would.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from inferpool.engine.states import ModelKey, model_key
from inferpool.errors import InferpoolError
from inferpool.settings import ModelSettings

if TYPE_CHECKING:
    from inferpool.engine.client import EngineClient
    from inferpool.engine.pool.pool import PoolClient


class EnvironmentWorkers:
    """The pool of environment groups beside an in-process client, started on first use."""

    def __init__(self, host: EngineClient) -> None:
        self.host = host
        self.pool: PoolClient | None = None
        self.keys: set[ModelKey] = set()  # the versions loaded in the pool's workers
        self._starting: asyncio.Future[PoolClient] | None = None

    async def _started(self) -> PoolClient:
        """The pool, its watchdog running (its groups start as models name them)."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        return await asyncio.shield(self._starting)

    async def _start(self) -> PoolClient:
        from inferpool.engine.pool.pool import PoolClient

        # Configured groups without an environment would hold nothing: the server process
        # holds every model without one.
        settings = self.host.settings
        groups = [group for group in settings.worker_groups if group.environment is not None]
        pool = PoolClient(settings.model_copy(update={"worker_groups": groups}), self.host)
        await pool.supervisor.start()
        self.pool = pool
        return pool

    async def load(self, settings: ModelSettings) -> dict[str, Any]:
        """Load the model's replicas in its environment's workers; its metadata."""
        pool = await self._started()
        metadata = await pool._load(settings)
        self.keys.add(model_key(settings.name, settings.version))
        return metadata

    async def unload(self, key: ModelKey) -> None:
        if self.pool is not None and key in self.keys:
            self.keys.discard(key)
            await self.pool._unload(key)

    def pool_of(self, key: ModelKey) -> PoolClient:
        """The pool holding ``key``, which the in-process client's ``_infer`` and
        ``_infer_stream`` hand the model's requests to."""
        assert self.pool is not None
        return self.pool

    def overload_refusal(self, key: ModelKey) -> InferpoolError | None:
        return self.pool_of(key).overload_refusal(key) if key in self.keys else None

    def running_requests(self) -> dict[ModelKey, int]:
        return self.pool.running_requests() if self.pool is not None else {}

    def live_reason(self) -> str | None:
        return self.pool.live_reason() if self.pool is not None else None

    def drop_shared_memory(self, serials: list[int]) -> None:
        if self.pool is not None:
            self.pool.drop_shared_memory(serials)

    def set_log_levels(self, levels: dict[str, int]) -> None:
        if self.pool is not None:
            self.pool.set_log_levels(levels)

    def on_shutdown(self) -> None:
        """Shutdown began: the pool's drain deadline is armed, no request waits for a
        replica any more."""
        if self.pool is not None:
            self.pool._on_shutdown()

    async def close(self) -> None:
        """Stop the workers and their templates (by the deadline armed at shutdown)."""
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        if self.pool is not None:
            await self.pool.supervisor.stop(self.pool._stop_deadline or time.monotonic())
