"""The frontend's side of the template process, which forks the workers.

``start_template`` launches the template (``worker/template.py``) as a fresh interpreter
(the server's, or an environment's: ``environments/interpreters.py``); ``TemplateProcess``
reads what it reports (the exit statuses of the workers it reaped, the models it
preloaded, the load it is running; its EOF says it has gone) and asks it to preload or
drop models. ``child_environment`` is the environment of any child running this very
interpreter and package (the template, the load probe).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferpool import logs
from inferpool.engine.environments import interpreters
from inferpool.engine.ipc import lifeline, messages
from inferpool.engine.ipc.channel import Channel, socket_pair
from inferpool.engine.ipc.messages import Op
from inferpool.engine.states import ModelKey, model_key
from inferpool.errors import WorkerLost
from inferpool.runtimes.base import THREAD_ENV

if TYPE_CHECKING:
    from inferpool.engine.pool.handles import WorkerHandle

# What a terminal's Ctrl-C or a service manager sends the whole group; only the frontend acts.
GROUP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
TEMPLATE_MODULE = "inferpool.engine.worker.template"


def child_environment() -> dict[str, str]:
    """The environment of a child running this very interpreter and package (the template,
    the load probe): whatever put the package on sys.path, and native pools of one thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    env.update(dict.fromkeys(THREAD_ENV, "1"))
    return env


def start_template(python: Path | None = None) -> tuple[subprocess.Popen[bytes], Channel]:
    """The template process, its native thread pools capped at one thread; ``python``:
    another environment's interpreter (``environments/interpreters.py``), else the server's.

    A library that reads its pool size when it is loaded (OpenBLAS, as scikit-learn's
    imports bring SciPy's in) starts its threads then; the template must have none to fork
    from, so it loads every library single-threaded. Each worker sets its own count after
    the fork (``process.limit_native_threads``).
    """
    ours, theirs = socket_pair()
    # It dies with us, SIGKILL included, and its workers too (``ipc/lifeline.py``): the
    # parent-death signal for it (started from this thread, the loop's, which lives as long
    # as we do: that signal follows a thread), our lifeline's read end for them all.
    alive = lifeline.read_end()
    # It logs as we do (levels, format), through us: ``logs.child_config``.
    args = (str(theirs.fileno()), json.dumps(logs.child_config()), str(alive))
    if python is None:
        argv, env = lifeline.command(TEMPLATE_MODULE, *args), child_environment()
    else:
        argv, env = interpreters.command(python, TEMPLATE_MODULE, *args, first=lifeline.PRELUDE)
        env.update(dict.fromkeys(THREAD_ENV, "1"))
    env[lifeline.PARENT_ENV] = str(os.getpid())
    # Started with SIGTERM and SIGINT blocked (the mask survives exec), so a signal to the
    # whole process group cannot kill it before it ignores them (template.main): the
    # frontend decides when the template and its workers stop.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, GROUP_SIGNALS)
    try:
        process = subprocess.Popen(argv, pass_fds=[theirs.fileno(), alive], env=env)
    except BaseException:
        ours.close()
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        theirs.close()
    return process, Channel(ours)


class TemplateProcess:
    """One template process and its control channel, watched from this loop.

    ``exited(pid, status)`` gets each reaped worker's wait status; ``gone(self)`` is
    called once when its channel reaches EOF (it has exited). ``copies`` are the model
    versions it holds, each with the epoch it came in at: a worker it forked at that epoch
    or later shares that copy (``shares``).
    """

    def __init__(
        self,
        exited: Callable[[int, int], None],
        gone: Callable[[TemplateProcess], None],
        python: Path | None = None,
    ) -> None:
        self.process, self.channel = start_template(python)
        self._gone = gone
        self._open = True
        self.epoch = 0  # its epoch as of its last answer
        self.copies: dict[ModelKey, messages.PreloadResult] = {}
        # Its last announced load not answered yet, and since when (``load_blame.py``).
        self.loading: messages.Loading | None = None
        self.loading_since = 0.0
        self.hung: float | None = None  # killed as hung after this many seconds of a load
        self._answers: dict[int, asyncio.Future[messages.Preloaded]] = {}
        self._tokens = itertools.count(1)
        self._dispatch = messages.Dispatch(
            {
                Op.EXITED: lambda message: exited(message.pid, message.status),
                Op.LOG: lambda message: logs.replay(message, "template", None),
                Op.PRELOADED: self._on_preloaded,
                Op.LOADING: self._on_loading,
            }
        )
        asyncio.get_running_loop().add_reader(self.channel.fileno(), self.receive)

    def _on_loading(self, message: messages.Loading) -> None:
        if not message.file:  # a new model: its time starts now
            self.loading_since = time.monotonic()
        self.loading = message

    async def preload(self, models: list[dict[str, Any]]) -> list[messages.PreloadResult]:
        """Have it load (or keep) these models, shared by the workers it forks from now on;
        how each went. ``WorkerLost`` if it exits first."""
        token = next(self._tokens)
        answer: asyncio.Future[messages.Preloaded] = asyncio.get_running_loop().create_future()
        self._answers[token] = answer
        try:
            self.channel.send_control(messages.Preload(models=models, token=token))
            return (await answer).models
        except OSError:
            raise WorkerLost("the worker template process exited") from None
        finally:
            self._answers.pop(token, None)

    def unpreload(self, key: ModelKey) -> None:
        """Have it drop its copy of a model version (unloaded: no worker uses it any more)."""
        copy = self.copies.pop(key, None)
        if copy is not None:
            with contextlib.suppress(OSError):  # it died: its copies died with it
                self.channel.send_control(messages.Unpreload(name=copy.name, version=copy.version))

    def shares(self, worker: WorkerHandle, key: ModelKey) -> bool:
        """``worker`` was forked from this template holding its current copy of ``key``."""
        copy = self.copies.get(key)
        return copy is not None and worker.template is self and worker.epoch >= copy.epoch

    def _on_preloaded(self, message: messages.Preloaded) -> None:
        self.loading = None
        self.epoch = message.epoch
        for result in message.models:
            if result.ok:
                self.copies[model_key(result.name, result.version)] = result
        answer = self._answers.get(message.token)
        if answer is not None and not answer.done():
            answer.set_result(message)

    def receive(self) -> None:
        """Take what it reported; EOF means the template itself has gone."""
        if self._open and not self.channel.dispatch_pending(self._dispatch):
            self._close()
            self._gone(self)

    def _close(self) -> None:
        for answer in self._answers.values():
            if not answer.done():
                answer.set_exception(WorkerLost("the worker template process exited"))
        if self._open:
            self._open = False
            with contextlib.suppress(ValueError):
                asyncio.get_running_loop().remove_reader(self.channel.fileno())
            self.channel.close()

    async def reap(self) -> int | None:
        """Wait for it to have exited (no zombie); its waitpid status, or None."""
        for _ in range(100):  # its channel closes a moment before it can be reaped
            code = self.process.poll()
            if code is not None:
                return -code if code < 0 else code << 8
            await asyncio.sleep(0.05)
        self.process.kill()
        await asyncio.to_thread(self.process.wait)
        return None

    async def stop(self, wait: float) -> None:
        """Close its channel (its EOF makes it exit); killed if not gone within ``wait``."""
        self._close()
        try:
            await asyncio.to_thread(self.process.wait, wait)
        except subprocess.TimeoutExpired:
            self.process.kill()
            await asyncio.to_thread(self.process.wait)
