"""Fake worker handles for the pool's unit tests (placement, generations): what those
modules use of a ``WorkerHandle``, answering a Load at once."""

from __future__ import annotations

import asyncio
from typing import Any

from inferpool.engine.ipc import messages
from inferpool.engine.pool.placement_choice import MIB
from inferpool.settings import ModelSettings


class Started:
    """A worker's hello, already answered."""

    def done(self) -> bool:
        return True


class FakeWorker:
    """What placement uses of a WorkerHandle; a Load is answered at once with ``size``."""

    def __init__(self, slot: int, size: int = 10 * MIB, error: str = "", gone: bool = False):
        self.slot = slot
        self.pid = 1000 + slot
        self.size = size
        self.error = error
        self.gone = gone  # its channel is closed: posting raises OSError
        self.alive = True
        self.retiring = False
        self.loading: Any = None
        self.hung = False
        self.hello = Started()
        self.models: dict[str, tuple[int, int]] = {}
        self.loads: dict[int, asyncio.Future[messages.Loaded]] = {}
        self.sent: list[messages.Control] = []

    def post_control(self, message: messages.Control) -> None:
        if self.gone:
            raise OSError("channel closed")
        self.sent.append(message)
        if isinstance(message, messages.Load):
            name = message.settings["name"]
            self.loads.pop(message.index).set_result(
                messages.Loaded(
                    index=message.index,
                    ok=not self.error,
                    error=self.error,
                    metadata={"name": name, "slot": self.slot},
                    size=self.size,
                )
            )

    def describe(self) -> str:
        return f"worker {self.slot}"

    def loaded(self) -> list[int]:
        return [m.index for m in self.sent if isinstance(m, messages.Load)]

    def unloaded(self) -> list[int]:
        return [m.index for m in self.sent if isinstance(m, messages.Unload)]


class AllCapable:
    """Every worker may hold every model."""

    def __init__(self, workers: list[FakeWorker]) -> None:
        self.workers = workers

    def eligible(self, settings: ModelSettings, workers: list[Any]) -> tuple[list[Any], dict]:
        return list(workers), {}

    def eligible_slots(self, settings: ModelSettings) -> set[int]:
        return {worker.slot for worker in self.workers}

    async def exit_status(self, worker: Any) -> int | None:
        return None
