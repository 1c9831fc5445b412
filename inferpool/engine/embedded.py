"""``inferpool.Engine``: the same engine inside a Python program, async or synchronous."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import orjson

from inferpool.engine.client import EngineClient, make_client
from inferpool.engine.states import ModelState
from inferpool.engine.worker.handler import KIND_REST
from inferpool.errors import from_status
from inferpool.settings import ServerSettings


class Engine:
    """Serve a model repository inside this process, with or without worker processes.

    ``async with Engine(repo) as engine: await engine.infer("iris", request)``, or
    ``with Engine(repo) as engine: engine.infer_sync("iris", request)``.
    """

    def __init__(self, repository: str | Path, workers: int = 0, **settings: Any) -> None:
        self.settings = ServerSettings(
            model_repository=Path(repository), workers=workers, **settings
        )
        self.client: EngineClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        self.client = make_client(self.settings)
        await self.client.start()
        statuses = await self.client.load_repository()
        self.client.started = True
        failed = [s for s in statuses if s.state is ModelState.FAILED]
        if failed and self.settings.exit_on_error:
            await self.close()
            raise RuntimeError("; ".join(s.describe() for s in failed))

    async def close(self) -> None:
        if self.client is not None:
            self.client.stopping = True
            await self.client.close()
            self.client = None

    async def infer(self, model: str, request: dict[str, Any], version: str | None = None):
        """A V2 request as a dict in, the V2 response as a dict out; errors raise."""
        if self.client is None:
            raise RuntimeError("the engine is not started")
        reply = await self.client.infer(model, version, KIND_REST, orjson.dumps(request), None)
        if reply.status != 200:
            raise from_status(reply.status, reply.body.decode())
        return orjson.loads(reply.body)

    def models(self) -> list[dict[str, Any]]:
        return [s.index_entry() for s in self.client.table.all()] if self.client else []

    # -- synchronous use: the engine runs on its own loop in a background thread ------------
    def infer_sync(self, model: str, request: dict[str, Any], version: str | None = None):
        return self._run(self.infer(model, request, version))

    def _run(self, coroutine):
        if self._loop is None:
            raise RuntimeError("use 'with Engine(...)' for synchronous calls")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __enter__(self) -> Engine:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        try:
            self._run(self.start())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is None:
            return
        self._run(self.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = None

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
