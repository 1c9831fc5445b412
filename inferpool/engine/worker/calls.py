"""A worker's side of a runtime's calls to other models (``inferpool/calls.py``).

A call goes to the frontend as a ``Call`` on the control channel and its answer comes
back as a ``CallReply``. The worker's own thread runs predicts, so a call made there
cannot simply block: while it waits, this module runs the worker's loop itself
(``wait_here``): it answers heartbeats, takes requests from the ring and runs those of
the models that are not waiting in a call (the callee may well be one of this worker's
own replicas; a model waiting in a call is never entered twice), answers streams and
cancellations, and keeps a load or an unload for after the predict returns. The running
record the frontend reads (which model runs since when) is put back after each request
run meanwhile, so the caller's timeout still applies to its predict as a whole. A call
from another thread (a stream's, a runtime's own) cannot count on the worker's loop,
which may be busy in the very predict that waits for this thread: it sends its calls on
a socket of its own (``CallChannel``, sent to the frontend at its first call) and reads
their answers there.

The call's parents are the ring ids of the requests the caller is running (from the
running record): the frontend finds the chain of calls through them. A call from a
thread other than the worker's starts a chain of its own.
"""

from __future__ import annotations

import itertools
import os
import select
import threading
import time
from typing import TYPE_CHECKING

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.call_ops import Call, CallChannel, CallReply
from inferpool.engine.ipc.channel import Channel, socket_pair

if TYPE_CHECKING:
    from inferpool.engine.worker.process import Worker

# Seconds a caller waits past its call's timeout for the frontend's answer (which comes at
# the timeout) before it gives up on its own.
GRACE = 5.0


class WorkerCalls:
    """The calls of one worker's runtimes (installed as ``inferpool.calls``' backend)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.loop_thread = threading.get_ident()  # the worker's loop: it runs the predicts
        self._ids = itertools.count(1)  # (a count's next is atomic under the GIL)
        # Per call waiting on the loop: its answer once in.
        self._answers: dict[int, CallReply | None] = {}
        self._local = threading.local()  # another thread's own channel (``CallChannel``)
        # The model indexes whose predict waits in a call on the loop, innermost last.
        self.busy: list[int] = []

    def call(
        self, model: str, version: str | None, body: bytes, json_length: int | None, timeout: float
    ) -> tuple[int, bytes, int | None]:
        worker = self.worker
        here = threading.get_ident() == self.loop_thread
        running = worker.requests.running() if here else None
        caller, parents, index = "", [], -1
        if running is not None:
            index, parents = running[0], running[1]
            held = worker.models.get(index)
            caller = held.name if held is not None else ""
        call_id = next(self._ids)
        message = Call(
            call_id=call_id, model=model, version=version, body=body, caller=caller,
            parents=parents, timeout=timeout,
            json_length=-1 if json_length is None else json_length,
        )  # fmt: skip
        deadline = time.monotonic() + timeout + GRACE
        try:
            if here:
                self._answers[call_id] = None
                worker.channel.send_control(message)
                answer = self.wait_here(call_id, index, deadline)
            else:
                channel = self._thread_channel()
                channel.send_control(message)
                answer = _wait_on(channel, call_id, deadline)
        except (OSError, EOFError):
            return 503, b"the server went away", None
        finally:
            self._answers.pop(call_id, None)
        if answer is None:
            return 504, f"model '{model}' did not answer within {timeout:g} s".encode(), None
        json = None if answer.json_length < 0 else answer.json_length
        return answer.status, answer.body, json

    def _thread_channel(self) -> Channel:
        """This thread's socket for its calls, sent to the frontend at its first call (it
        closes with the thread)."""
        channel: Channel | None = getattr(self._local, "channel", None)
        if channel is None:
            ours, theirs = socket_pair()
            try:
                self.worker.channel.send_control(CallChannel(), fds=[theirs.fileno()])
            finally:
                theirs.close()
            channel = self._local.channel = Channel(ours)
        return channel

    def replied(self, message: CallReply) -> None:
        """A ``CallReply`` came in on the worker's channel: its caller waits in
        ``wait_here`` (else it gave up, and the answer is dropped)."""
        if message.call_id in self._answers:
            self._answers[message.call_id] = message

    def wait_here(self, call_id: int, index: int, deadline: float) -> CallReply | None:
        """Run the worker's loop until the call's answer comes in (None: past ``deadline``,
        or the frontend has gone)."""
        worker = self.worker
        record = worker.requests.running()
        log_running = worker.log.running
        poller = worker.poller()
        self.busy.append(index)
        try:
            while self._answers.get(call_id) is None:
                now = time.monotonic()
                if now >= deadline:
                    return None
                wait = deadline - now
                with worker.batcher.holding(self.busy):
                    due = worker.batcher.timeout(time.monotonic_ns())
                if due is not None:
                    wait = min(wait, due)
                controlled = worker.wake(poller, wait)
                if controlled and not worker.channel.dispatch_pending(worker.nested_dispatch):
                    return None  # the frontend has gone: the worker's loop exits after
                with worker.batcher.holding(self.busy):
                    groups = worker.batcher.due(time.monotonic_ns())
                if groups:
                    worker.run_groups(groups)
                    # What ran meanwhile marked itself: the caller's record again.
                    if record is not None:
                        worker.requests.mark_running(record[0], record[1], record[2])
                    worker.log.running = log_running
        finally:
            self.busy.pop()
        return self._answers.get(call_id)


def _wait_on(channel: Channel, call_id: int, deadline: float) -> CallReply | None:
    """The answer of ``call_id`` on a thread's own channel (None: past ``deadline``);
    the late answer of an earlier call that gave up is skipped."""
    poller = select.poll()
    poller.register(channel.fileno(), select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(max(1, int(left * 1000))):
            return None
        op, payload, fds = channel.receive(block=False)
        for fd in fds:
            os.close(fd)
        answer = messages.decode(op, payload)
        if isinstance(answer, CallReply) and answer.call_id == call_id:
            return answer
