"""``inferpool.Engine``: the same engine inside a Python program, async or synchronous.

The engine starts as the server's does (``EngineClient.start``: workers, every model of
the repository, ``exit_on_error`` honoured) and stops as it does. Requests go in as
numpy arrays, DataFrames, mappings of arrays or V2 requests (``embedded_io``) and come
back as an ``InferenceResult``: with ``workers=0`` the typed request runs the worker
path in this process, with workers it crosses to them as raw tensor bytes, never JSON.

The embedding program is the operator: ``load``/``unload`` are its to call, so the
repository API is on (``model_control_mode="explicit"``) unless the settings say
otherwise.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from inferpool.engine.client import EngineClient, make_client
from inferpool.engine.embedded_io import DEFAULT_INPUT, InferenceResult, build_request
from inferpool.engine.inprocess import InProcessClient
from inferpool.engine.ipc.messages import Kind
from inferpool.errors import from_status
from inferpool.protocol.grpc_raw import from_wire, to_wire
from inferpool.settings import ServerSettings

T = TypeVar("T")


class Engine:
    """Serve a model repository inside this process, with or without worker processes.

    ``async with Engine(repo) as engine: await engine.infer("iris", X)``, or
    ``with Engine(repo) as engine: engine.infer_sync("iris", X)``. ``settings`` are
    ``ServerSettings`` fields (``exit_on_error``, ``model_control_mode``, ...).
    """

    def __init__(self, repository: str | Path, workers: int = 0, **settings: Any) -> None:
        settings.setdefault("model_control_mode", "explicit")
        self.settings = ServerSettings(
            model_repository=Path(repository), workers=workers, **settings
        )
        self.client: EngineClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        """Start the workers (if any) and load every model of the repository.

        A model that fails raises ``StartupFailed`` (a ``RuntimeError`` naming each
        one) unless ``exit_on_error=False``; the engine is closed again then.
        """
        self.client = make_client(self.settings)
        try:
            await self.client.start()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.close()

    def _client(self) -> EngineClient:
        if self.client is None:
            raise RuntimeError("the engine is not started")
        return self.client

    # -- inference --------------------------------------------------------------------------
    async def infer(
        self,
        model: str,
        inputs: Any,
        outputs: Sequence[str] | None = None,
        *,
        version: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> InferenceResult:
        """Run ``model`` on ``inputs``; errors raise (``ModelNotFound``, ``BadRequest``, ...).

        ``inputs``: a numpy array (the model's one declared input, else ``input-0``), a
        pandas DataFrame (one input per column; the model gets a DataFrame), a mapping of
        input name to array, or a V2 request (an ``InferenceRequest`` or its JSON shape as
        a dict). ``outputs``: the outputs to compute (the model's default when None).
        """
        client = self._client()
        request = build_request(inputs, outputs, parameters, _input_name(client, model, version))
        if isinstance(client, InProcessClient) and client.runs_here(model, version):
            return InferenceResult(await client.infer_request(model, version, request))
        reply = await client.infer(model, version, Kind.GRPC, to_wire(request), None)
        if reply.status != 200:
            raise from_status(reply.status, reply.body.decode())
        return InferenceResult(from_wire(reply.body))

    # -- the model repository ---------------------------------------------------------------
    async def load(self, name: str) -> None:
        """(Re)load every version of a model the repository holds; the reason raises if
        one fails (a version that was serving keeps serving then)."""
        await self._client().load_model(name)

    async def unload(self, name: str) -> None:
        """Unload every version of a model (in any state); ``ModelNotFound`` for a name
        not listed."""
        await self._client().unload_model(name)

    def models(self) -> list[dict[str, Any]]:
        """Every model version listed: name, state, reason (and version), as the
        repository index."""
        return [s.index_entry() for s in self.client.table.all()] if self.client else []

    # -- synchronous use: the engine runs on its own loop in a background thread ------------
    def infer_sync(
        self,
        model: str,
        inputs: Any,
        outputs: Sequence[str] | None = None,
        *,
        version: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> InferenceResult:
        return self._run(self.infer(model, inputs, outputs, version=version, parameters=parameters))

    def load_sync(self, name: str) -> None:
        self._run(self.load(name))

    def unload_sync(self, name: str) -> None:
        self._run(self.unload(name))

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coroutine.close()
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
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._run(self.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._loop = self._thread = None

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _input_name(client: EngineClient, model: str, version: str | None) -> str:
    """The name a lone array takes: the model's input when it declares exactly one."""
    declared = client.table.find(model, version).metadata.get("inputs") or []
    return str(declared[0]["name"]) if len(declared) == 1 else DEFAULT_INPUT
