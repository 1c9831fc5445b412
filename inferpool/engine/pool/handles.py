"""The frontend's side of one worker process.

``WorkerHandle`` creates one worker's rings, doorbells and control channel, asks the
template (``template_process.py``) to fork a worker with them, sends to it without
blocking, completes the requests it answers, and keeps what the pool tracks per worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inferpool import logs
from inferpool.engine import custom_metrics_sum
from inferpool.engine.ipc import messages, metrics_report
from inferpool.engine.ipc.call_ops import Call, CallChannel, CallReply
from inferpool.engine.ipc.channel import Channel, Outgoing, socket_pair
from inferpool.engine.ipc.messages import Op, Reply, ReplyHeader
from inferpool.engine.ipc.ring import Ring, create_ring_fd
from inferpool.engine.states import ModelKey
from inferpool.errors import WorkerLost
from inferpool.protocol.limits import DecodeLimits
from inferpool.request_ids import resolve_internal

if TYPE_CHECKING:
    from inferpool.engine.pool.template_process import TemplateProcess

# A bigger body travels in its own memfd, which costs the frontend ~100 µs (create, write,
# send the fd): 256 KiB holds a 256-row batch of 50 features as JSON (~140 KB). The ring's
# pages are only allocated as slots are written, so small requests keep it small.
SLOT_SIZE = 256 * 1024
RECEIVE_BATCH = 64  # control messages taken from a worker per wake-up (the rest: next one)
# How a call is answered (``WorkerHandle.on_call``).
Answer = Callable[[CallReply], None]


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
        self.hello: asyncio.Future[None] = loop.create_future()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.inflight: dict[int, asyncio.Future[Reply]] = {}
        self.loads: dict[int, asyncio.Future[messages.Loaded]] = {}
        self.outbox: collections.deque[Outgoing] = collections.deque()
        self.models: dict[ModelKey, tuple[int, int]] = {}  # version → (model index, bytes)
        self.template: TemplateProcess | None = None  # the template that forked it
        self.epoch = 0  # that template's epoch when it forked this one (``Hello``)
        # Replaced by a new generation: it finishes what it holds, then exits (no restart).
        self.retiring = False
        # It asked to be replaced (``engine/pool/recycling.py`` acts on it): Recycle's message.
        self.recycle: messages.Recycle | None = None
        self.large_requests = 0  # sent over its channel, not its ring (``requests_sent``)
        # Forked while workers were stalled, beside the slots (``stalls.py``): retired
        # once none is.
        self.standby = False
        # Its last announced load not answered yet (``load_blame.py``), and since when.
        self.loading: messages.Loading | None = None
        self.loading_since = 0.0
        self.hung: float | None = None  # killed as hung after this many seconds of a load
        self.dispatch = messages.Dispatch(
            {
                Op.HELLO: self._on_hello,
                Op.LOADED: self._on_loaded,
                Op.REPLY: self._on_reply,
                Op.PONG: self._on_pong,
                Op.LOG: self._on_log,
                Op.METRICS: self._on_metrics,
                Op.RECYCLE: self._on_recycle,
                Op.LOADING: self._on_loading,
                Op.CALL: self._on_call,
                Op.CALL_CHANNEL: self._on_call_channel,
            }
        )
        # Runs a runtime's call to another model, and answers it with the function given
        # (``PoolClient.serve_call``); set by the supervisor.
        self.on_call: Callable[[WorkerHandle, Call, Answer], None] | None = None
        # The sockets the worker's threads send their calls on (``CallChannel``).
        self.call_channels: list[Channel] = []

    def _on_loading(self, message: messages.Loading) -> None:
        if not message.file:
            self.loading_since = time.monotonic()
        self.loading = message

    def ask_template(
        self, template: Channel, threads: int, limits: DecodeLimits, memory_limit: int = 0
    ) -> None:
        """Have the template fork this worker with its fds; ours of theirs close after.
        ``memory_limit``: bytes it may map beyond its start (0: none)."""
        spec = messages.Spawn(
            worker=self.slot, threads=threads, slots=self.requests.slots, slot_size=SLOT_SIZE,
            limits=limits.to_dict(), memory_limit=memory_limit,
        )  # fmt: skip
        fds = [*self.fds, self.request_bell, self.reply_bell, self.child_socket.fileno()]
        try:
            template.send_control(spec, fds=fds)
        finally:
            for fd in self.fds:
                os.close(fd)
            self.fds = []
            self.child_socket.close()

    def watch(self, died: Callable[[WorkerHandle], None]) -> None:
        """Forked: read its channel and reply doorbell from this loop; ``died(self)`` at EOF."""
        loop = asyncio.get_running_loop()
        loop.add_reader(self.channel.fileno(), self._receive, died)
        loop.add_reader(self.reply_bell, self.drain_replies)
        self.alive = True

    def _receive(self, died: Callable[[WorkerHandle], None]) -> None:
        self.last_seen = time.monotonic()
        # A bounded batch: a worker that floods us (log records) cannot hold the loop.
        if self.alive and not self.channel.dispatch_pending(self.dispatch, RECEIVE_BATCH):
            died(self)

    # -- to the worker ---------------------------------------------------------------------
    def post(self, op: int, *parts: bytes) -> None:
        """Send without ever blocking the loop; a full socket queues here until writable.

        (The worker may itself be blocked sending us replies; blocking both would deadlock.)
        """
        message = Outgoing(op, parts)
        if op == Op.REQUEST:
            self.large_requests += 1
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

    def post_control(self, message: messages.Control) -> None:
        """``post`` a typed control message."""
        self.post(message.op, messages.encode(message))

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
        inflight = self.inflight
        for fields, body in self.replies.pop_all():
            future = inflight.pop(fields[0], None)
            if future is not None and not future.done():  # else its caller went away
                future.set_result(Reply.from_fields(fields, body))

    def _on_reply(self, payload: bytes | messages.Parts) -> None:
        """A reply too big for a slot (its own memfd, over the control channel)."""
        packed, body = messages.header_and_body(payload)
        header = ReplyHeader.unpack_from(packed)
        future = self.inflight.pop(header.request_id, None)
        if future is not None and not future.done():
            future.set_result(Reply.from_header(header, body))

    def _on_loaded(self, message: messages.Loaded) -> None:
        self.loading = None
        future = self.loads.pop(message.index, None)
        if future is not None and not future.done():
            future.set_result(message)

    def _on_hello(self, message: messages.Hello) -> None:
        self.pid, self.epoch = message.pid, message.epoch
        if not self.hello.done():
            self.hello.set_result(None)

    def _on_metrics(self, message: metrics_report.Metrics) -> None:
        custom_metrics_sum.FRONTEND.update(self.pid, message)

    def _on_call(self, message: Call) -> None:
        if self.on_call is not None:
            self.on_call(self, message, self.post_control)
        else:  # (only a worker started outside a supervisor has no one to run it)
            self.post_control(CallReply(call_id=message.call_id, status=500, body=b"no calls here"))

    def _on_call_channel(self, message: CallChannel, fds: list[int]) -> None:
        """A socket for one thread's calls: read here, answered on it."""
        for fd in fds[1:]:
            os.close(fd)
        channel = Channel(socket.socket(fileno=fds[0]))
        self.call_channels.append(channel)

        def answer(reply: CallReply) -> None:
            # Never blocks the loop: its thread waits for it (else it gave up: dropped).
            with contextlib.suppress(OSError):
                channel.send_packed(Outgoing(reply.op, [messages.encode(reply)]), block=False)

        def on_call(call: Call) -> None:
            if self.on_call is not None:
                self.on_call(self, call, answer)

        calls = messages.Dispatch({Op.CALL: on_call})
        asyncio.get_running_loop().add_reader(channel.fileno(), self._receive_calls, channel, calls)

    def _receive_calls(self, channel: Channel, calls: messages.Dispatch) -> None:
        if not channel.dispatch_pending(calls, RECEIVE_BATCH):  # its thread has ended
            self._close_call_channel(channel)

    def _close_call_channel(self, channel: Channel) -> None:
        asyncio.get_running_loop().remove_reader(channel.fileno())
        channel.close()
        self.call_channels.remove(channel)

    def _on_recycle(self, message: messages.Recycle) -> None:
        self.recycle = message

    @property
    def requests_sent(self) -> int:
        """Requests sent to it so far (its ring's count, which costs nothing per request,
        and those too big for a slot)."""
        return self.requests.produced + self.large_requests

    def _on_pong(self, message: messages.Pong) -> None:
        """Nothing to do: any message counts as a sign of life (``last_seen``)."""

    def _on_log(self, message: messages.Log) -> None:
        """A record of the worker's, through our handlers, with the ids of its requests."""
        ids = [resolve_internal(internal) for internal in message.requests]
        logs.replay(message, str(self.slot), ",".join(i for i in ids if i) or None)

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
        for channel in list(self.call_channels):
            self._close_call_channel(channel)
        for message in self.outbox:
            message.release()
        self.outbox.clear()
        failed = Reply.from_error(WorkerLost(f"{reason} while running the request; retry it"))
        for future in self.inflight.values():
            if not future.done():
                future.set_result(failed)
        self.inflight.clear()
        waiting: list[asyncio.Future[Any]] = [*self.loads.values(), self.hello]
        for waiter in waiting:
            if not waiter.done():
                waiter.set_exception(WorkerLost(reason))
                waiter.exception()  # retrieved here: a waiter may be gone
        self.loads.clear()
        custom_metrics_sum.FRONTEND.worker_gone(self.pid)  # its counters keep what it reported
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
        retiring = "retiring " if self.retiring else ""
        standby = "standby " if self.standby else ""
        return f"{retiring}{standby}worker {self.slot} (pid {self.pid})"
