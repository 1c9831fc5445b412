"""The template process that forks workers: a clean, single-threaded parent.

The pool starts it as a fresh interpreter (``python -m inferpool.engine.worker.template FD``)
before any worker, so it has no event loop, no gRPC threads and no OpenMP pool, whatever
the frontend has started. It imports the runtimes once, loads the repository's models
whose runtime allows it (``preload.py``), freezes the heap (``gc.freeze()``) so workers
share those pages copy-on-write, and forks a worker for each SPAWN message, handing it
the fds that came with the message. Respawns after a crash come from here too. It reaps
the workers it forked and tells the frontend how each ended (EXITED: killed by which
signal, or its exit code), so that a crash can be reported with its cause. It exits
when the frontend's end of its channel closes.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import select
import signal
import socket
import sys

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.channel import Channel

# Imported before any fork so every worker shares them; a missing library is skipped.
PRELOAD = (
    "numpy",
    "pandas",
    "orjson",
    "inferpool.engine.worker.process",
    "inferpool.engine.worker.preload",
    "inferpool.protocol.rest_wire",
    "inferpool.protocol.grpc_wire",
    "inferpool.runtimes.sklearn",
    "sklearn.ensemble",
    "sklearn.linear_model",
    "sklearn.pipeline",
    "sklearn.preprocessing",
    "inferpool.runtimes.lightgbm",
    "inferpool.runtimes.xgboost",
)


def preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def serve(channel: Channel, wakeup: int) -> None:
    """Act on the frontend's messages; report every worker that exits (SIGCHLD wakes us)."""
    poller = select.poll()
    poller.register(channel.fileno(), select.POLLIN)
    poller.register(wakeup, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll()}
        if wakeup in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wakeup, 512):
                    pass
            if not report_exits(channel):
                return
        if channel.fileno() not in ready:
            continue
        try:
            op, payload, fds = channel.receive(block=False)
        except BlockingIOError:
            continue
        except (EOFError, ConnectionError):
            return
        for fd in fds if op != messages.SPAWN else ():
            os.close(fd)
        if op == messages.PRELOAD:
            from inferpool.engine.worker.preload import preload

            preload(messages.decode_control(payload)["models"])
        if op != messages.SPAWN:
            continue
        spec = messages.decode_control(payload)
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(signal.set_wakeup_fd(-1))  # the pipe's writer
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wakeup)
                channel.close()
                from inferpool.engine.worker import process as worker

                worker.main(spec, fds)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)


def report_exits(channel: Channel) -> bool:
    """Reap every exited worker and send its wait status; False if the frontend is gone."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return True
        try:
            document = messages.encode_control({"pid": pid, "status": status})
            channel.send(messages.EXITED, document)
        except OSError:
            return False


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the frontend decides when to stop
    # SIGCHLD only wakes the loop (through the wakeup pipe); the loop reaps and reports.
    wakeup, wakeup_writer = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_writer)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    channel = Channel(socket.socket(fileno=int(sys.argv[1])))
    preload()
    serve(channel, wakeup)


if __name__ == "__main__":
    main()
