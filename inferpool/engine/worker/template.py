"""The template process that forks workers: a clean, single-threaded parent.

The pool starts it as a fresh interpreter (``python -m inferpool.engine.worker.template FD
LOGGING LIFELINE``) before any worker, so it has no event loop, no gRPC threads and no OpenMP pool,
whatever the frontend has started. It imports the runtimes once, loads the models the frontend
asks for whose runtime allows it (PRELOAD, answered by PRELOADED; UNPRELOAD drops one:
``preload.py``), freezes the heap (``gc.freeze()``) so workers share those pages
copy-on-write, and forks a worker for each SPAWN message, handing it the fds that came
with the message. Respawns after a crash, and each new generation of workers that takes
over from the old one after a model was loaded here, come from here too. Its *epoch*
grows whenever its set of models changes; each worker learns the epoch it was forked at
(its HELLO says it), so the frontend knows which copies a worker holds. A load that
started a thread here makes this process unsafe to fork from: it answers, then exits. It reaps
the workers it forked and tells the frontend how each ended (EXITED: killed by which
signal, or its exit code), so that a crash can be reported with its cause. It ignores
SIGTERM and SIGINT, as its workers do, and exits when the frontend's end of its channel
closes (the frontend stopped, or was killed). Busy, it and its workers still die with the
frontend (``lifeline.py``, which starts it). Its log records, and its workers', go to the
frontend (``inferpool.logs``): LOGGING is the frontend's ``logs.child_config()``.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys

from inferpool import logs
from inferpool.engine.ipc import lifeline, messages
from inferpool.engine.ipc.channel import Channel
from inferpool.engine.ipc.messages import Op

# What every worker uses, whatever its models: imported before any fork so that workers
# share it. A runtime's modules (scikit-learn's estimators: 1.3 s of CPU) are imported
# when the template first loads one of its models (``preload.py``), not by every start-up.
PRELOAD = (
    "numpy",
    "pandas",
    "orjson",
    "inferpool.engine.worker.process",
    "inferpool.engine.worker.preload",
    "inferpool.protocol.rest_wire",
    "inferpool.protocol.grpc_wire",
)


def preload(names: tuple[str, ...] = PRELOAD) -> None:
    """Import these modules (the engine's by default); one whose library is not installed
    is skipped (its models then fail to load, in the worker)."""
    for name in names:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


class Template:
    """The template's loop: the frontend's messages in, forked workers and exit reports out."""

    def __init__(self, channel: Channel, wakeup: int, alive: int) -> None:
        self.channel = channel
        self.wakeup = wakeup  # readable when SIGCHLD arrived
        self.alive = alive  # our lifeline to the frontend, which each worker holds too
        self._fds: list[int] = []  # those that came with the message being handled
        self.epoch = 0  # grows whenever the set of preloaded models changes
        self.dispatch = messages.Dispatch(
            {
                Op.PRELOAD: self._preload,
                Op.UNPRELOAD: self._unpreload,
                Op.SPAWN: self._spawn,
                # Workers forked from now on log at these levels too.
                Op.LOG_LEVELS: lambda message: logs.set_levels(message.levels),
            }
        )

    def serve(self) -> None:
        """Act on the frontend's messages; report every worker that exits."""
        poller = select.poll()
        poller.register(self.channel.fileno(), select.POLLIN)
        poller.register(self.wakeup, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self.wakeup in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wakeup, 512):
                        pass
                if not self.report_exits():
                    return
            if self.channel.fileno() not in ready:
                continue
            try:
                op, payload, self._fds = self.channel.receive(block=False)
            except BlockingIOError:
                continue
            except (EOFError, ConnectionError):
                return
            try:
                self.dispatch(op, payload)
            except ConnectionError:
                return  # the frontend went away while we answered (it stopped): exit
            finally:
                for fd in self._fds:  # a handler takes the fds it keeps
                    os.close(fd)
                self._fds = []

    def _preload(self, message: messages.Preload) -> None:
        from inferpool.engine.worker import preload

        results, self.epoch = preload.preload(message.models, self.epoch, self.channel.send_control)
        answer = messages.Preloaded(token=message.token, epoch=self.epoch, models=results)
        self.channel.send_control(answer)
        if any(result.forked_threads for result in results):
            # Forking a multi-threaded process copies only this thread: locks held by the
            # others stay held in the child. Its threads are the model's: no clean exit.
            os._exit(0)

    def _unpreload(self, message: messages.Unpreload) -> None:
        from inferpool.engine.worker import preload

        self.epoch += preload.unpreload(message.name, message.version)

    def _spawn(self, spec: messages.Spawn) -> None:
        fds, self._fds = self._fds, []
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                # Not our parent-death signal: it would kill the workers when we exit
                # (restarted) while they serve. The frontend's death kills them.
                lifeline.hold(self.alive)
                if self.alive >= 0:
                    os.close(self.alive)
                os.close(signal.set_wakeup_fd(-1))  # the pipe's writer
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(self.wakeup)
                self.channel.close()
                from inferpool.engine.worker import process

                process.main(spec, fds, self.epoch)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)

    def report_exits(self) -> bool:
        """Reap every exited worker and send its wait status; False if the frontend is gone."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return True
            try:
                self.channel.send_control(messages.Exited(pid=pid, status=status))
            except OSError:
                return False


def main() -> None:
    # argv: our channel's fd, the logging config, the frontend's lifeline. (Our parent-death
    # signal was set before we imported anything: ``lifeline.command``.)
    alive = lifeline.hold(int(sys.argv[3]))
    os.close(int(sys.argv[3]))
    # A signal to the whole group (Ctrl-C, systemd's stop, ``kill -TERM -PGID``) is the
    # frontend's to act on: it drains, then closes our channel. Both came blocked
    # (``template_process.start_template``) so that none is lost to the default action
    # before now; one pending meanwhile is dropped once ignored. Workers inherit the
    # dispositions.
    for group_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(group_signal, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    # SIGCHLD only wakes the loop (through the wakeup pipe); the loop reaps and reports.
    wakeup, wakeup_writer = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_writer)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    channel = Channel(socket.socket(fileno=int(sys.argv[1])))
    logs.configure_child(json.loads(sys.argv[2]), channel, "template")
    preload()
    Template(channel, wakeup, alive).serve()


if __name__ == "__main__":
    main()
