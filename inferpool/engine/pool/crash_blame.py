"""Crash blame: how a dead worker ended, and the model it was running held to account.

A worker's template reaps it and reports its waitpid status (``crashes.ExitStatuses``);
a worker whose template died before it is reaped here (``reap_orphan``: as PID 1 the
server may be its parent). A worker that died running a model's group counts a crash
against that model once its status is known (``crashes.CrashBook``), and the pool
quarantines a model whose requests keep killing workers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from inferpool.engine.pool.crashes import CrashBook, ExitStatuses
from inferpool.engine.pool.handles import WorkerHandle
from inferpool.engine.pool.template_process import TemplateProcess

logger = logging.getLogger(__name__)

EXIT_STATUS_WAIT = 1.0  # how long a crash report waits for the template's exit status


class Accused(Protocol):
    """What blame asks of the pool, and tells it."""

    def model_name(self, model_index: int) -> str | None:
        """The model served under this index, None once unloaded or replaced."""

    def quarantine(self, model_index: int, reason: str) -> None:
        """The model under this index keeps crashing workers."""


class CrashBlame:
    """Exit statuses, crash counts per model, and the orphans to reap."""

    def __init__(
        self,
        models: Accused,
        keep: Callable[[Coroutine[Any, Any, Any]], None],
        template_of: Callable[[WorkerHandle], TemplateProcess | None],
    ) -> None:
        self.models = models
        self.keep = keep
        self.template_of = template_of  # the template running now in the worker's group
        self.crashes = CrashBook()
        self.exits = ExitStatuses()

    async def exit_status(self, worker: WorkerHandle) -> int | None:
        """How ``worker`` ended (a waitpid status, reported by its template), None if that is
        not known within ``EXIT_STATUS_WAIT``."""
        status = self._status_now(worker)
        return status if status is not None else await self.exits.wait(worker.pid, EXIT_STATUS_WAIT)

    def _status_now(self, worker: WorkerHandle) -> int | None:
        """``worker``'s exit status if its template has reported it by now."""
        template = self.template_of(worker)
        if template is not None:
            template.receive()  # its exit status may already be waiting
        return self.exits.take(worker.pid)

    def blame(self, worker: WorkerHandle, model_index: int, request_ids: list[int]) -> None:
        """Count a crash against the model it was running, once its exit status is known."""
        if self.models.model_name(model_index) is None:
            return
        status = self._status_now(worker)
        if status is not None:
            self.count_crash(worker, model_index, request_ids, status)
        else:
            self.keep(self._blame_when_reaped(worker, model_index, request_ids))

    async def _blame_when_reaped(
        self, worker: WorkerHandle, model_index: int, request_ids: list[int]
    ) -> None:
        status = await self.exits.wait(worker.pid, EXIT_STATUS_WAIT)
        if status is None:
            logger.warning("no exit status for %s; its crash is not counted", worker.describe())
        elif self.models.model_name(model_index) is not None:  # not unloaded or replaced
            self.count_crash(worker, model_index, request_ids, status)

    def count_crash(
        self, worker: WorkerHandle, model_index: int, request_ids: list[int], status: int
    ) -> None:
        """Quarantine a model whose requests keep killing workers."""
        name = self.models.model_name(model_index) or f"#{model_index}"
        now = time.monotonic()
        reason = self.crashes.count(worker.describe(), name, request_ids, status, now)
        if reason is not None:
            self.models.quarantine(model_index, reason)

    async def reap_orphan(self, pid: int) -> None:
        """Reap a worker whose template died before it, if it is ours to reap."""
        for _ in range(40):  # its channel closes a moment before it can be reaped
            try:
                reaped, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return  # not our child: init reaps it
            if reaped:
                self.exits.reported(pid, status)
                return
            await asyncio.sleep(0.05)
