"""``workers=0``: models load and predict in the frontend process (embedding, debugging).

The worker path (``worker/handler.py``) runs here on the event loop's thread; loads run
in a thread, one at a time, so the loop keeps answering health checks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from inferpool.engine.client import EngineClient
from inferpool.engine.worker.handler import Reply
from inferpool.errors import InferpoolError
from inferpool.protocol import limits
from inferpool.settings import ModelSettings, ServerSettings

logger = logging.getLogger(__name__)


class InProcessClient(EngineClient):
    """``workers=0``: models load and predict in the frontend process (embedding, debug)."""

    def __init__(self, settings: ServerSettings) -> None:
        super().__init__(settings)
        from inferpool.engine.worker.model import LoadedModel

        limits.configure(limits.DecodeLimits.from_settings(settings))
        self.models: dict[str, LoadedModel] = {}

    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        from inferpool.engine.worker.model import failure_reason

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
        from inferpool.engine.worker.handler import handle

        return handle(self.models[name], kind, body, json_length)


# Loads run in a thread (the loop keeps answering health checks), one at a time: a
# library's first import can happen inside any load (importing a runtime module,
# unpickling, a user's load()), and two threads importing one library at once see it
# half-initialised (sklearn: ImportError) or deadlock (LightGBM). Worker processes load
# one model at a time anyway.
_LOAD_LOCK = threading.Lock()


def _load_one_at_a_time(settings: ModelSettings) -> Any:
    from inferpool.engine.worker.model import load_model

    with _LOAD_LOCK:
        return load_model(settings)
