"""The frontend's side of the worker processes: the template process and worker handles.

``start_template`` launches the template (``zygote.py``) as a fresh interpreter;
``WorkerHandle`` creates one worker's rings, doorbells and control channel, asks the
template to fork a worker with them, sends to it without blocking, completes the
requests it answers, and keeps what the pool tracks per worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import subprocess
import sys
import time

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.channel import Channel, Outgoing, socket_pair
from inferpool.engine.ipc.ring import Ring, create_ring_fd
from inferpool.engine.stats import StageTimes
from inferpool.engine.worker.handler import Reply
from inferpool.errors import InferpoolError
from inferpool.protocol.limits import DecodeLimits

SLOT_SIZE = 64 * 1024  # a bigger body travels in its own memfd
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def start_template(threads: int) -> tuple[subprocess.Popen, Channel]:
    """The template process, with each future worker capped at ``threads`` native threads."""
    ours, theirs = socket_pair()
    env = dict(os.environ)
    env.update(dict.fromkeys(THREAD_ENV, str(threads)))
    # The template imports this very package, whatever put it on sys.path.
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "inferpool.engine.worker.template", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, Channel(ours)


class WorkerHandle:
    """The frontend's side of one worker process."""

    def __init__(self, slot: int, slots: int) -> None:
        self.slot = slot
        self.pid = 0
        self.alive = False
        self.closed = False
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
        self.template: subprocess.Popen | None = None  # the template that forked it

    def ask_template(self, template: Channel, threads: int, limits: DecodeLimits) -> None:
        """Have the template fork this worker with its fds; ours of theirs close after."""
        spec = {"worker": self.slot, "threads": threads, "slots": self.requests.slots}
        spec["slot_size"] = SLOT_SIZE
        spec["limits"] = limits.to_dict()
        fds = [*self.fds, self.request_bell, self.reply_bell, self.child_socket.fileno()]
        try:
            template.send(messages.SPAWN, messages.encode_control(spec), fds=fds)
        finally:
            for fd in self.fds:
                os.close(fd)
            self.fds = []
            self.child_socket.close()

    # -- to the worker ---------------------------------------------------------------------
    def post(self, op: int, *parts: bytes) -> None:
        """Send without ever blocking the loop; a full socket queues here until writable.

        (The worker may itself be blocked sending us replies; blocking both would deadlock.)
        """
        message = Outgoing(op, parts)
        if not self.outbox:
            try:
                self.channel.send_packed(message, block=False)
                return
            except BlockingIOError:
                asyncio.get_running_loop().add_writer(self.channel.fileno(), self._flush)
            except OSError:
                message.release()
                raise
        self.outbox.append(message)

    def _flush(self) -> None:
        while self.outbox:
            try:
                self.channel.send_packed(self.outbox[0], block=False)
            except BlockingIOError:
                return
            except OSError:
                break  # it died; its EOF cleans up
            self.outbox.popleft()
        asyncio.get_running_loop().remove_writer(self.channel.fileno())

    # -- from the worker -------------------------------------------------------------------
    def drain_replies(self) -> None:
        """Complete every request the response ring holds (the doorbell's callback)."""
        self.last_seen = time.monotonic()
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.reply_bell)
        for fields, body in self.replies.pop_all():
            self.complete(fields, body)

    def complete(self, fields: tuple, body: bytes) -> None:
        future = self.inflight.pop(fields[0], None)
        if future is None or future.done():
            return  # its caller went away
        json_length = fields[5]
        times = StageTimes(*fields[8:12])
        future.set_result(Reply(fields[4], body, None if json_length < 0 else json_length, times))

    def close(self, reason: str) -> None:
        """It is gone: fail what it held (503), release its rings, doorbells and channel.

        ``reason`` ends up in the 503 of each request it held. Closing twice is harmless.
        """
        self.alive = False
        if self.closed:
            return
        self.closed = True
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.channel.fileno())
        loop.remove_writer(self.channel.fileno())
        loop.remove_reader(self.reply_bell)
        for message in self.outbox:
            message.release()
        self.outbox.clear()
        failed = Reply(503, f"{reason} while running the request; retry it".encode())
        for future in self.inflight.values():
            if not future.done():
                future.set_result(failed)
        self.inflight.clear()
        for future in [*self.loads.values(), self.hello]:
            if not future.done():
                future.set_exception(InferpoolError(reason))
                future.exception()  # retrieved here: a waiter may be gone
        self.loads.clear()
        if not self.exited.done():
            self.exited.set_result(None)
        for fd in self.fds:  # never handed to the template
            os.close(fd)
        self.fds = []
        self.child_socket.close()
        self.channel.close()
        os.close(self.request_bell)
        os.close(self.reply_bell)
        self.requests.close()
        self.replies.close()

    def describe(self) -> str:
        return f"worker {self.slot} (pid {self.pid})"
