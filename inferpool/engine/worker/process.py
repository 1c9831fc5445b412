"""A worker process: drain its request ring → batch → run → encode → reply.

It is forked by the template process (``template.py``) with its fds already open: the
request and response rings, one eventfd doorbell per direction and its end of the
control socketpair. It sleeps in ``poll`` on the request doorbell and the control
channel, takes every pending request at each wake-up, runs those of a model that batches
together (``batching.py``: joined up to its rows, never waiting unless its settings ask),
and rings the response doorbell once per execution it answers. It exits when told to stop
(after finishing what is queued) or at once when the frontend's end of the control
channel closes (the frontend was killed); SIGTERM and SIGINT, sent to the whole process
group, are ignored. A predict that calls another model (``calls.py``) runs this loop
itself while it waits for the answer.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import signal
import socket
import threading
import time

from inferpool import calls, logs
from inferpool.engine.ipc import messages, stream_ops
from inferpool.engine.ipc.channel import Channel
from inferpool.engine.ipc.messages import Kind, Op, Reply, RequestHeader
from inferpool.engine.ipc.ring import Ring
from inferpool.engine.worker import shm_regions
from inferpool.engine.worker.announce import announcing
from inferpool.engine.worker.batching import Batcher
from inferpool.engine.worker.calls import WorkerCalls
from inferpool.engine.worker.heap import release_freed_memory
from inferpool.engine.worker.memory_limit import MemoryLimit, install
from inferpool.engine.worker.metrics_reporter import Reporter
from inferpool.engine.worker.model import (
    LoadedModel,
    failure_reason,
    load_model,
    unload_model,
)
from inferpool.engine.worker.path import Job, run_executions
from inferpool.engine.worker.preload import forget, preloaded
from inferpool.engine.worker.priority import requested_level
from inferpool.engine.worker.streaming import WorkerStreams, streams
from inferpool.engine.worker.warmup import warm_up
from inferpool.errors import BadRequest, ClientGone, NotReady
from inferpool.protocol import limits
from inferpool.runtimes.base import THREAD_ENV
from inferpool.runtimes.footprint import model_footprint
from inferpool.settings import ModelSettings

logger = logging.getLogger(__name__)


def limit_native_threads(threads: int) -> None:
    """Size the BLAS/OpenMP pools of this worker: those of the libraries already loaded
    (the template loaded them single-threaded), and through the environment, those of the
    libraries loaded later."""
    os.environ.update(dict.fromkeys(THREAD_ENV, str(threads)))
    with contextlib.suppress(ImportError):
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)


class Worker:
    def __init__(self, spec: messages.Spawn, fds: list[int], epoch: int) -> None:
        request_fd, reply_fd, self.request_bell, self.reply_bell, control_fd = fds
        self.worker_id = spec.worker
        self.epoch = epoch
        limits.configure(limits.DecodeLimits(**spec.limits))
        self.threads = spec.threads
        self.memory = MemoryLimit(spec.memory_limit, spec.threads)
        self.requests = Ring(request_fd, spec.slots, spec.slot_size)
        self.replies = Ring(reply_fd, spec.slots, spec.slot_size)
        os.close(request_fd)
        os.close(reply_fd)
        self.channel = Channel(socket.socket(fileno=control_fd))
        # Its log records go to the frontend's handlers; stderr keeps a crash's last words.
        self.log = logs.forward_to(self.channel, str(self.worker_id))
        self.models: dict[int, LoadedModel] = {}
        self.batcher = Batcher()
        self.streams = WorkerStreams()  # streamed requests (predict_stream), in a thread
        self.stopping = False
        # The runtimes' custom metrics, sent batched: never one message per request.
        self.metrics = Reporter(self.channel.send_control)
        handlers: dict[Op, messages.Handler] = {
            Op.REQUEST: self._on_request,
            Op.LOAD: self._load,
            Op.UNLOAD: self._on_unload,
            Op.CANCEL: self._on_cancel,
            Op.CREDIT: self._on_credit,
            Op.FEED: self._on_feed,
            Op.END_INPUT: self._on_end_input,
            Op.PING: self._on_ping,
            Op.STOP: self._on_stop,
            Op.LOG_LEVELS: lambda message: logs.set_levels(message.levels),
            Op.SHM_DROP: lambda message: shm_regions.drop(message.serials),
            Op.CALL_REPLY: lambda message: self.calls.replied(message),
        }
        self.dispatch = messages.Dispatch(handlers)
        # While a predict waits in a call to another model (``calls.py``), the channel is
        # read by that wait: a load or an unload is kept for after the predict returns.
        self.deferred: collections.deque[tuple[messages.Handler, messages.Control]] = (
            collections.deque()
        )
        self.nested_dispatch = messages.Dispatch(
            {
                **handlers,
                Op.LOAD: lambda message: self.deferred.append((self._load, message)),
                Op.UNLOAD: lambda message: self.deferred.append((self._on_unload, message)),
            }
        )
        self.calls = WorkerCalls(self)

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> None:
        limit_native_threads(self.threads)
        install(self.memory)  # after the rings are mapped: they count as shared
        self.calls.loop_thread = threading.get_ident()
        calls.install(self.calls)  # a runtime's calls to other models (inferpool.calls)
        self.channel.send_control(messages.Hello(pid=os.getpid(), epoch=self.epoch))
        poller = self.poller()
        while True:
            now = time.monotonic_ns()
            wait = self.batcher.timeout(now)
            report = self.metrics.wait(now)
            if report is not None and (wait is None or report < wait):
                wait = report
            controlled = self.wake(poller, wait)
            if controlled and not self._take_control():
                return
            self._run_due()
            while self.deferred:  # kept while a predict waited in a call
                handler, message = self.deferred.popleft()
                handler(message)
            idle = not self.batcher and not self.requests.pending() and not self.streams
            if self.stopping and idle:
                self.metrics.report(force=True)
                return
            self.metrics.report()

    def poller(self) -> select.poll:
        """What the worker waits on: the request bell, the control channel, the streams'
        bell."""
        poller = select.poll()
        for fd in (self.request_bell, self.channel.fileno(), self.streams.bell):
            poller.register(fd, select.POLLIN)
        return poller

    def wake(self, poller: select.poll, wait: float | None) -> bool:
        """Wait on ``poller`` up to ``wait`` seconds (None: until woken), read the bells
        that rang, answer the streams, take the ring's requests; True if the control
        channel has something (a message, or the frontend gone: POLLHUP). Also the loop a
        predict runs while it waits in a call (``calls.py``)."""
        timeout = None if wait is None else max(1, int(wait * 1000 + 0.999))
        # The frontend rings the request bell only while this says it may block: a
        # request pushed since the ring was last read has no bell coming.
        if not self.requests.may_sleep():
            timeout = 0
        events = poller.poll(timeout)
        self.requests.awake()
        controlled = False
        for fd, _ in events:
            if fd == self.request_bell:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self.request_bell)
            elif fd == self.streams.bell:
                self.answer_streams()
            else:  # the control channel
                controlled = True
        # The ring first: requests sent before a control message (an unload) are
        # queued before that message is acted on.
        self.take_requests()
        return controlled

    def _run_due(self) -> None:
        """Run the groups that are due. (In a method of its own so that no local of the
        main loop keeps the last model run alive after it is unloaded.)"""
        self.run_groups(self.batcher.due(time.monotonic_ns(), flush=self.stopping))

    def run_groups(self, due: list[tuple[LoadedModel, list[Job]]]) -> None:
        """Run groups taken from the batcher (also while a predict waits in a call)."""
        for model, jobs in due:
            if model.batching.joins:
                self._run(model, jobs)
            else:  # answered one by one, so that none waits for the rest
                for job in jobs:
                    self._run(model, [job])
        if due:
            self.requests.mark_idle()
            self.log.running = ()

    def _run(self, model: LoadedModel, jobs: list[Job]) -> None:
        """Run a group, answering each execution's requests as soon as it is done."""
        max_memory = model.settings.max_memory
        if max_memory:  # its calls under a cap of their own (worker/memory_limit.py)
            with self.memory.call(max_memory):
                self._run_group(model, jobs)
        else:
            self._run_group(model, jobs)
        if self.memory.tripped is not None:
            self._ask_to_be_recycled()

    def _run_group(self, model: LoadedModel, jobs: list[Job]) -> None:
        self._mark_running(jobs)
        answered = [False] * len(jobs)
        left = len(jobs)
        for positions, replies in run_executions(model, jobs):
            self._answer([jobs[position] for position in positions], replies)
            for position in positions:
                answered[position] = True
            left -= len(positions)
            if left:
                pending = zip(jobs, answered, strict=True)
                self._mark_running([job for job, done in pending if not done])

    def _ask_to_be_recycled(self) -> None:
        """A call hit the worker's memory limit: the server replaces this worker."""
        recycle = self.memory.take_tripped()
        if recycle is not None:
            self.channel.send_control(recycle)

    def _mark_running(self, jobs: list[Job]) -> None:
        """Record what runs, and since when: the frontend blames a crash on it and
        recycles this worker when it runs past its model's timeout (re-marked after each
        execution of a group, so that the timeout applies to each one)."""
        running = [job.request_id for job in jobs]
        self.requests.mark_running(jobs[0].model_index, running, time.monotonic_ns())
        self.log.running = running  # the requests its log records name

    def take_requests(self) -> None:
        for fields, body in self.requests.pop_all():
            self._enqueue(RequestHeader.of(fields), body, fields[4])

    def _enqueue(self, header: RequestHeader, body: bytes, level: int = 0) -> None:
        """Queue a request; ``level``: the priority its header asked for (0: none)."""
        job = Job(header, body)
        model = self.models.get(header.model_index)
        if model is None:
            message = f"worker {self.worker_id} does not hold that model (was it unloaded?)"
            self._answer([job], [Reply.from_error(NotReady(message))])
            return
        if header.kind >= Kind.REST_STREAM and streams(model.runtime):
            self.streams.start(model, job)  # the other kinds: one reply, as any request
            return
        try:
            job.rank = level or requested_level(header.kind, body, header.json_length)
        except BadRequest as exc:
            self._answer([job], [Reply.from_error(exc, model.name)])
            return
        job.rank = job.rank or model.default_rank
        self.batcher.add(model, job)

    def _take_control(self) -> bool:
        """Act on every pending control message; False when the frontend has gone."""
        return self.channel.dispatch_pending(self.dispatch)

    def _on_request(self, payload: bytes | messages.Parts) -> None:
        header, body = messages.header_and_body(payload)
        level = messages.HEADER.unpack_from(header)[4]  # its priority (``_take_requests``)
        self._enqueue(RequestHeader.unpack_from(header), body, level)

    def _on_unload(self, message: messages.Unload) -> None:
        # Requests pushed to the ring before the unload was sent are queued first (the
        # ring was read before this message, but more may have come since).
        self.take_requests()
        model = self.models.pop(message.index, None)
        # (A reload of unchanged files took the same template copy under a new index.)
        if model is None or any(held is model for held in self.models.values()):
            return
        unload_model(model)
        forget(model)  # the template's copy as this process inherited it: freed now
        del model
        release_freed_memory()

    def _on_cancel(self, message: messages.Cancel) -> None:
        job = self.batcher.cancel(message.request_id)
        if job is not None:  # the frontend still counts it until it is answered
            self._answer([job], [Reply.from_error(ClientGone("the client went away"))])
        else:
            self.streams.cancel(message.request_id)

    def _on_credit(self, message: stream_ops.Credit) -> None:
        self.streams.credit(message.request_id, message.chunks)

    def _on_feed(self, message: stream_ops.Feed) -> None:
        # Its stream's first request may still be in the ring: started before it is fed.
        self.take_requests()
        self.streams.feed(message.request_id, message.body)

    def _on_end_input(self, message: stream_ops.EndInput) -> None:
        self.take_requests()
        self.streams.feed(message.request_id, None)

    def answer_streams(self) -> None:
        ready = self.streams.take()
        if ready:
            self._answer([job for job, _ in ready], [reply for _, reply in ready])
            if self.memory.tripped is not None:  # (a stream runs in a thread of its own)
                self._ask_to_be_recycled()

    def _on_ping(self, message: messages.Ping) -> None:
        self.channel.send_control(messages.Pong())

    def _on_stop(self, message: messages.Stop) -> None:
        self.stopping = True

    # -- replies ---------------------------------------------------------------------------
    def _answer(self, jobs: list[Job], replies: list[Reply]) -> None:
        rang = False
        for job, reply in zip(jobs, replies, strict=True):
            header = messages.reply_header(job.request_id, reply)
            if self.replies.push(header, reply.body):
                rang = True
            else:  # too big for a slot: its own memfd over the control channel
                self.channel.send(Op.REPLY, header, reply.body)
        if rang:
            os.eventfd_write(self.reply_bell, 1)

    # -- control ---------------------------------------------------------------------------
    def _load(self, message: messages.Load) -> None:
        try:
            copy = preloaded(message.settings)  # the template's, shared with it
            if copy is not None:
                model, size = copy
            else:
                settings = ModelSettings(**message.settings)
                with announcing(self.channel.send_control, settings.name, settings.version):
                    model = load_model(settings)
                size = model_footprint(model)
                release_freed_memory()  # what the loader freed
            model.runtime.limit_threads(self.threads)
            warm_up(model, f"in worker {self.worker_id}")  # before it is READY: docs/warmup.md
        except Exception as exc:
            error = failure_reason(self.memory.load_failed(exc, message.settings.get("name", "")))
            answer = messages.Loaded(index=message.index, ok=False, error=error)
        else:
            self.models[message.index] = model
            answer = messages.Loaded(
                index=message.index, ok=True, metadata=model.announced(), size=size,
                predictor=model.runtime.predictor(),
            )  # fmt: skip
        self.channel.send_control(answer)


def main(spec: messages.Spawn, fds: list[int], epoch: int) -> None:
    """Run a worker in this (freshly forked) process until it is told to stop; ``epoch``:
    the template's when it forked this one (which of its models this one shares)."""
    # A signal to the whole group reaches us too; the frontend drains, then stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    Worker(spec, fds, epoch).run()
