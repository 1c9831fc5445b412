"""The frontend's side of the worker processes: the template process and worker handles.

``start_template`` launches the template (``zygote.py``) as a fresh interpreter;
``WorkerHandle`` creates one worker's rings, doorbells and control channel, asks the
template to fork a worker with them, and keeps what the pool tracks per worker.
"""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess
import sys
import time

from inferpool.engine import messages
from inferpool.engine.channel import Channel, Outgoing, socket_pair
from inferpool.engine.ring import Ring, create_ring_fd

SLOT_SIZE = 64 * 1024  # a bigger body travels in its own memfd
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def start_template(threads: int) -> tuple[subprocess.Popen, Channel]:
    """The template process, with each future worker capped at ``threads`` native threads."""
    ours, theirs = socket_pair()
    env = dict(os.environ)
    env.update(dict.fromkeys(THREAD_ENV, str(threads)))
    # The template imports this very package, whatever put it on sys.path.
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    process = subprocess.Popen(
        [sys.executable, "-m", "inferpool.engine.zygote", str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        env=env,
    )
    theirs.close()
    return process, Channel(ours)


class WorkerHandle:
    """The frontend's side of one worker process."""

    def __init__(self, slot: int, slots: int) -> None:
        self.slot = slot
        self.pid = 0
        self.alive = False
        self.started_at = time.monotonic()
        self.last_seen = self.started_at  # last time it sent anything (heartbeats)
        request_fd, reply_fd = create_ring_fd(slots, SLOT_SIZE), create_ring_fd(slots, SLOT_SIZE)
        self.fds = [request_fd, reply_fd]
        self.requests = Ring(request_fd, slots, SLOT_SIZE)
        self.replies = Ring(reply_fd, slots, SLOT_SIZE)
        self.request_bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.reply_bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        ours, theirs = socket_pair()
        self.channel = Channel(ours)
        self.child_socket = theirs
        loop = asyncio.get_running_loop()
        self.hello: asyncio.Future = loop.create_future()
        self.exited: asyncio.Future = loop.create_future()
        self.inflight: dict[int, asyncio.Future] = {}
        self.loads: dict[int, asyncio.Future] = {}
        self.outbox: collections.deque[Outgoing] = collections.deque()
        self.models: dict[str, tuple[int, int]] = {}  # name → (model index, bytes)

    def ask_template(self, template: Channel, threads: int) -> None:
        """Have the template fork this worker with its fds; ours of theirs close after."""
        spec = {"worker": self.slot, "threads": threads, "slots": self.requests.slots}
        spec["slot_size"] = SLOT_SIZE
        fds = [*self.fds, self.request_bell, self.reply_bell, self.child_socket.fileno()]
        try:
            template.send(messages.SPAWN, messages.encode_control(spec), fds=fds)
        finally:
            for fd in self.fds:
                os.close(fd)
            self.fds = []
            self.child_socket.close()

    @property
    def used(self) -> int:
        return sum(size for _, size in self.models.values())

    def describe(self) -> str:
        return f"worker {self.slot} (pid {self.pid})"
