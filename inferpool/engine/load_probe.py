"""``--workers 0``: each model of a built-in runtime is loaded in a short-lived child first.

A model file can crash its library's loader (LightGBM and XGBoost abort, or segfault, on
some truncated files, and hang on others); in the server process that would take the
server with it. ``LoadProbe.check`` has a child (``worker/probe.py``, a fresh interpreter:
the server has threads and must not fork) load the model first: a load that fails there
fails with the child's reason, one that kills the child or hangs past ``timeout`` fails
with one sentence naming its file and library (``pool/load_blame.py``), and only a model that
loaded there is loaded by the server. Loads asked together (start-up) share one child,
which loads them one after the other; after a crash a new child takes the rest.
Custom runtimes are not probed: their ``load`` may have effects that must happen once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from inferpool.engine.ipc import lifeline
from inferpool.engine.ipc.messages import Loading
from inferpool.engine.pool.load_blame import blame
from inferpool.engine.pool.template_process import child_environment
from inferpool.errors import ModelLoadError
from inferpool.runtimes.registry import RUNTIMES, runtime_name_for
from inferpool.settings import ModelSettings

logger = logging.getLogger(__name__)

PROBE_MODULE = "inferpool.engine.worker.probe"


def probed(settings: ModelSettings) -> bool:
    """Whether the model's load is probed: a built-in runtime (one that reads a file)."""
    try:
        return runtime_name_for(settings) in RUNTIMES
    except Exception:  # no runtime can be told: the load itself says why
        return False


@dataclass(eq=False)
class _Ask:
    document: dict[str, Any]
    done: asyncio.Future[str | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class LoadProbe:
    """Children that load models before the server does; one at a time, batching asks."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout  # seconds one load may take there; 0: no limit
        self.children = 0  # children started (readable by tests and metrics)
        self._queue: list[_Ask] = []
        self._runner: asyncio.Task[None] | None = None

    async def check(self, settings: ModelSettings) -> None:
        """Load the model in a child; ModelLoadError with the reason if it fails there."""
        ask = _Ask(settings.model_dump(mode="json"))
        self._queue.append(ask)
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        reason = await asyncio.shield(ask.done)
        if reason is not None:
            raise ModelLoadError(reason)

    async def close(self) -> None:
        """Stop probing (shutdown): a child still loading is killed and reaped."""
        runner, self._runner = self._runner, None
        if runner is not None and not runner.done():
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner

    async def _run(self) -> None:
        await asyncio.sleep(0)  # the loads asked in this turn come along
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                while batch:
                    batch = await self._child(batch)
            except Exception as exc:  # the probe itself failed: the server loads them
                logger.warning("cannot probe model loads in a child process: %s", exc)
                for ask in batch:
                    if not ask.done.done():
                        ask.done.set_result(None)

    async def _child(self, batch: list[_Ask]) -> list[_Ask]:
        """Load ``batch`` in one child; those left when it died (after its culprit)."""
        reader_fd, writer_fd = os.pipe()
        # It dies with the server, SIGKILL included (``ipc/lifeline.py``).
        env = child_environment()
        env[lifeline.PARENT_ENV] = str(os.getpid())
        try:
            process = await asyncio.create_subprocess_exec(
                *lifeline.command(PROBE_MODULE, str(writer_fd)),
                stdin=asyncio.subprocess.PIPE, pass_fds=[writer_fd], env=env,
            )  # fmt: skip
        except BaseException:
            os.close(reader_fd)
            raise
        finally:
            os.close(writer_fd)
        self.children += 1
        assert process.stdin is not None
        process.stdin.write(json.dumps([ask.document for ask in batch]).encode())
        process.stdin.close()
        try:
            loading, hung = await self._read(reader_fd, batch)
            if hung is not None:
                process.kill()
            code = await process.wait()
        except BaseException:  # cancelled (shutdown): the child goes too, reaped
            if process.returncode is None:
                process.kill()
                await asyncio.shield(process.wait())
            raise
        status = -code if code < 0 else code << 8  # as waitpid says it
        left = [ask for ask in batch if not ask.done.done()]
        if loading is not None and left:
            culprit = batch[loading[0]]
            if not culprit.done.done():
                culprit.done.set_result(blame(loading[1], status, hung))
            left = [ask for ask in left if ask is not culprit]
        elif left:  # it died before loading anything: nothing to blame, the server loads
            logger.warning("the load probe process exited with code %d before its loads", code)
            for ask in left:
                ask.done.set_result(None)
            left = []
        return left

    async def _read(
        self, reader_fd: int, batch: list[_Ask]
    ) -> tuple[tuple[int, Loading] | None, float | None]:
        """What the child reports on its pipe (``_follow``), until it stops."""
        lines = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(lines), os.fdopen(reader_fd, "rb")
        )
        try:
            return await self._follow(batch, lines)
        finally:
            transport.close()

    async def _follow(
        self, batch: list[_Ask], lines: asyncio.StreamReader
    ) -> tuple[tuple[int, Loading] | None, float | None]:
        """Settle each ask as the child reports; the load under way when it stopped
        reporting (its index and announcement), and the timeout if it hung."""
        loading: tuple[int, Loading] | None = None
        since = time.monotonic()
        while True:
            wait = None
            if self.timeout > 0:
                wait = max(0.0, self.timeout - (time.monotonic() - since))
            try:
                line = await asyncio.wait_for(lines.readline(), wait)
            except TimeoutError:
                return loading, self.timeout
            if not line:
                return loading, None
            record = json.loads(line)
            if "done" in record:
                index = record["done"]
                batch[index].done.set_result(record["error"])
                loading = None
                continue
            index = record["loading"]
            name = batch[index].document.get("name", "")
            version = (batch[index].document.get("parameters") or {}).get("version")
            if loading is None or loading[0] != index:
                since = time.monotonic()
            announcement = Loading(
                name=name, version=version, file=record["file"], library=record["library"]
            )
            loading = (index, announcement)
