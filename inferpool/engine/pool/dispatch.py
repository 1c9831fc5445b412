"""Dispatch: which worker runs a request, and the way there and back.

``Dispatcher`` owns the routes (per model version, under its ``ModelKey``: its index in
the workers and its READY replicas), picks the least-loaded replica (the first one when
it is idle, so that requests one at a time keep one worker warm; under load ties go
round-robin), answers ``Overloaded`` when every replica's queue is full, puts the request
in the worker's ring (or its control channel when bigger than a slot) and registers it
in the worker's in-flight map, and cancels it when its caller goes away.

While the workers holding a model's replicas are replaced, its requests wait (bounded
by ``REPLICA_WAIT`` and their deadline) for a replica to come back, then fail with
``NotReady``. The supervisor tells the pool when a worker is lost (``worker_lost``),
placement publishes routes and their replicas (``publish``, ``replica_ready``, ``drop``).
The metrics ask which requests the workers are running now (``running``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import struct
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.messages import Op, Reply
from inferpool.engine.ipc.stream_ops import MORE
from inferpool.engine.pool.handles import WorkerHandle
from inferpool.engine.states import (
    ModelKey,
    ModelState,
    ModelTable,
    describe_key,
    model_key,
    model_label,
)
from inferpool.engine.stream_feed import feeding
from inferpool.engine.stream_sink import StreamSink
from inferpool.errors import BadRequest, NotReady, Overloaded, WorkerLost
from inferpool.protocol.priority import LEVEL
from inferpool.request_ids import track
from inferpool.settings import ModelSettings

# A model whose every replica is being replaced stays READY this long, its requests
# waiting for a replica (a recycle takes about a second); then it turns LOADING.
REPLICA_WAIT = 10.0


class Route:
    """Where one model version's requests go: its index in the workers and its READY
    replicas."""

    def __init__(self, settings: ModelSettings, index: int, default_timeout: float) -> None:
        self.settings = settings
        self.key = model_key(settings.name, settings.version)
        self.label = model_label(self.key)
        self.index = index
        self.ready: list[WorkerHandle] = []
        # Replicas on workers stalled by a long call (``stalls.py``): out of ``ready``
        # until it ends; used only when no other replica is ready and no standby worker
        # is coming for this model (``standby_coming``).
        self.stalled: list[WorkerHandle] = []
        self.standby_coming = False
        self.slots: set[int] = set()  # the worker slots meant to hold a replica
        self.turn = 0  # whose turn a tie is, under load
        self.empty_since: float | None = None  # since when no replica is ready
        self.back: asyncio.Event | None = None  # set when a replica is ready again
        self.waiting = 0  # requests waiting for it
        timeout = settings.timeout if settings.timeout is not None else default_timeout
        self.timeout = timeout if timeout and timeout > 0 else 0.0

    @property
    def name(self) -> str:
        return self.settings.name

    def describe(self) -> str:
        """``model 'name'`` (and its version, if it has one), for messages."""
        return describe_key(self.key)

    def replica_back(self) -> None:
        """A replica is ready again, or never will be: wake the waiting requests."""
        self.empty_since = None
        self.wake()

    def wake(self) -> None:
        """Wake the requests waiting for a replica (they look again)."""
        if self.back is not None:
            self.back.set()
            self.back = None


class Dispatcher:
    """The routes, and every request's way to a replica."""

    def __init__(
        self, table: ModelTable, max_queue: int, workers: int, stopping: Callable[[], bool]
    ) -> None:
        self.table = table
        self.max_queue = max_queue  # requests per worker
        self.worker_count = workers
        self.stopping = stopping
        self.routes: dict[ModelKey, Route] = {}
        self._by_index: dict[int, Route] = {}
        self._ids = itertools.count(1)

    # -- routes (placement and supervision tell) ---------------------------------------------
    def route_of(self, model_index: int) -> Route | None:
        """The published route with this index (None once unloaded or replaced)."""
        return self._by_index.get(model_index)

    def publish(self, route: Route) -> Route | None:
        """``route`` serves its model from now on; the route it replaces, if any."""
        old = self.routes.get(route.key)
        self.routes[route.key] = route
        self._by_index[route.index] = route
        if old is not None:
            self._by_index.pop(old.index, None)
            old.replica_back()  # requests waiting for the old version take the new one
        return old

    def drop(self, route: Route) -> None:
        """The model is unloaded or quarantined: no request goes to ``route`` any more."""
        if self.routes.get(route.key) is route:
            del self.routes[route.key]
        self._by_index.pop(route.index, None)
        route.replica_back()

    def current(self, route: Route) -> bool:
        """Whether ``route`` still serves its model."""
        return self.routes.get(route.key) is route

    def replica_ready(self, route: Route, worker: WorkerHandle) -> bool:
        """A replacement worker holds ``route``'s model again; False if that is moot now."""
        if not self.current(route) or not worker.alive:
            return False
        route.ready.append(worker)
        route.replica_back()
        return True

    def worker_lost(self, worker: WorkerHandle) -> None:
        """``worker`` is gone: its replicas take no more requests."""
        for key in worker.models:
            route = self.routes.get(key)
            if route is not None and worker in route.stalled:
                route.stalled.remove(worker)
            if route is None or worker not in route.ready:
                continue
            route.ready.remove(worker)
            if not route.ready and route.empty_since is None:
                # It stays READY a moment: its requests wait for the replacement's replica.
                route.empty_since = time.monotonic()

    def waited_too_long(self, now: float) -> list[ModelKey]:
        """Model versions without a replica for longer than ``REPLICA_WAIT``."""
        return [
            key
            for key, route in self.routes.items()
            if route.empty_since is not None and now - route.empty_since > REPLICA_WAIT
        ]

    def running(self, workers: Iterable[WorkerHandle | None]) -> dict[ModelKey, int]:
        """Per model version, its requests that a worker is running now (the metrics read
        it at scrape time from each worker's running record). A group whose replies this
        loop has taken already is over, whatever the record still says; a group of a
        route replaced or dropped since counts for no version."""
        counts: dict[ModelKey, int] = {}
        for worker in workers:
            if worker is None or worker.closed:
                continue
            group = worker.requests.running_group()
            if group is None:
                continue
            model_index, count, first = group
            route = self._by_index.get(model_index)
            if route is not None and first in worker.inflight:
                counts[route.key] = counts.get(route.key, 0) + count
        return counts

    def wake_all(self) -> None:
        """Shutdown: no replica comes back now, the waiting requests fail."""
        for route in self.routes.values():
            route.replica_back()

    # -- requests ----------------------------------------------------------------------------
    def pick(self, route: Route) -> WorkerHandle | None:
        """The least-loaded replica with room in its queue: the first ready one when it is
        idle, else ties go round-robin.

        An idle first replica takes the request: with requests one at a time (a single
        client), one worker then takes them all and keeps its caches warm, where turns
        would wake each worker after the others had evicted its code and data. Under load
        the queues decide, and ties go round-robin as they always did (every tie to the
        first replica measured 0.88x and 0.92x on iris batch-1 REST at c64, within this
        machine's noise but not shown harmless: benchmarks/RESULTS.md, 2026-12-04)."""
        ready = route.ready  # never empty: ``_send`` waits for a replica first
        if not ready[0].inflight:
            return ready[0]
        route.turn += 1
        start = route.turn % len(ready)
        worker = None
        fewest = self.max_queue
        for candidate in ready[start:] + ready[:start]:
            queued = len(candidate.inflight)
            if queued < fewest:
                worker, fewest = candidate, queued
        return worker

    def overloaded(self, route: Route) -> Overloaded:
        """The refusal of a request that finds every queue of ``route`` full."""
        return Overloaded(
            f"{route.describe()} is overloaded: every replica's queue is full "
            f"({self.max_queue} requests per worker); retry later"
        )

    def refusal(self, key: ModelKey) -> Overloaded | None:
        """The ``Overloaded`` a request for ``key`` would meet now, without waiting, or
        None: ``_send``'s own tests (``pick``, ``least_loaded``, the bound on requests
        waiting for a replica), with no side effect and no allocation when admitted, so
        that a frontend can refuse a request from its headers before reading its body
        (``frontends/rest/early.py``). A route not published is left to ``_send``."""
        route = self.routes.get(key)
        if route is None:
            return None
        limit = self.max_queue
        if route.ready:
            workers = route.ready
        elif route.stalled and not route.standby_coming:
            workers = route.stalled
        else:
            if route.waiting >= limit * self.worker_count:
                return restarting(route)
            return None
        for worker in workers:
            if len(worker.inflight) < limit:
                return None
        return self.overloaded(route)

    async def infer(
        self, key: ModelKey, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> Reply:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        sent = await self._send(key, kind, body, json_length, deadline, future)
        if isinstance(sent, Reply):
            return sent
        worker, request_id = sent
        try:
            return await future
        except asyncio.CancelledError:
            if worker.alive and request_id in worker.inflight:
                # Its caller went away: the worker drops it if it has not started.
                with contextlib.suppress(OSError):
                    worker.post_control(messages.Cancel(request_id=request_id))
            raise

    async def stream(
        self,
        key: ModelKey,
        kind: int,
        body: bytes,
        json_length: int | None,
        deadline: float | None,
        more: AsyncIterator[bytes] | None = None,
    ) -> AsyncGenerator[Reply, None]:
        """A streamed request's replies (``stream_sink``): chunks marked ``MORE``, then
        the last one; ``more``: the requests its client sends after it, fed into the same
        stream (``stream_feed``). Closing the iterator early cancels the stream in its
        worker."""
        sink: StreamSink | None = None

        def receiver(worker: WorkerHandle, request_id: int) -> StreamSink:
            nonlocal sink
            sink = StreamSink(worker, request_id)
            return sink

        sent = await self._send(key, kind, body, json_length, deadline, receiver)
        if isinstance(sent, Reply):
            yield sent
            return
        assert sink is not None
        try:
            async with feeding(more, sink):
                while True:
                    reply = await sink.next()
                    yield reply
                    if not reply.flags & MORE:
                        return
        finally:
            sink.close()

    async def _send(
        self,
        key: ModelKey,
        kind: int,
        body: bytes,
        json_length: int | None,
        deadline: float | None,
        receiver: asyncio.Future[Reply] | Callable[[WorkerHandle, int], StreamSink],
    ) -> tuple[WorkerHandle, int] | Reply:
        """Put a request in a replica's queue, its ``receiver`` (a future, or what makes
        a stream's sink) in that worker's in-flight map; the worker and the request id, or
        the reply when the worker could not take it."""
        route = self.routes.get(key)
        if route is None:
            raise NotReady(f"{describe_key(key)} has no ready replica")
        if route.ready:
            worker = self.pick(route)
        else:
            worker = await self._no_ready_replica(key, route, deadline)
        if worker is None:
            raise self.overloaded(route)
        request_id = next(self._ids)
        # Packed before anything is registered: a value it cannot carry is the client's
        # error (400) and leaves nothing behind.
        try:
            header = messages.request_header(
                request_id, route.index, kind, json_length, deadline, len(body), LEVEL.get()
            )
        except (ValueError, OverflowError, TypeError, struct.error) as exc:
            raise BadRequest(str(exc)) from None
        if callable(receiver):
            worker.inflight[request_id] = receiver(worker, request_id)  # type: ignore[assignment]
        else:
            worker.inflight[request_id] = receiver
        try:
            send(worker, header, body)
        except OSError:  # it died and its EOF is not handled yet, or no fd for the memfd
            worker.inflight.pop(request_id, None)
            lost = WorkerLost(f"{worker.describe()} could not take the request; retry it")
            return Reply.from_error(lost)
        except BaseException:
            worker.inflight.pop(request_id, None)
            raise
        track(request_id)  # its request id, for the worker's log records (request_ids)
        return worker, request_id

    async def _no_ready_replica(
        self, key: ModelKey, route: Route, deadline: float | None
    ) -> WorkerHandle | None:
        """Where a request goes when no replica is ready: a standby worker's once it is up
        (if one is coming), else the least-loaded stalled replica (it waits behind the long
        call), else a replacement's once it is back (bounded wait)."""
        if route.stalled and not route.standby_coming:
            return least_loaded(route.stalled, self.max_queue)
        route = await self._wait_for_replica(key, route, deadline)
        if route.ready:
            return self.pick(route)
        return least_loaded(route.stalled, self.max_queue)

    async def _wait_for_replica(self, key: ModelKey, route: Route, deadline: float | None) -> Route:
        """Wait (bounded) while the workers holding the model's replicas are replaced, or
        while a standby worker loads it; the route, with a ready or a stalled replica."""
        if self.stopping():
            raise NotReady(f"{route.describe()} has no ready replica: the server is shutting down")
        if route.waiting >= self.max_queue * self.worker_count:
            raise restarting(route)
        if route.back is None:
            route.back = asyncio.Event()
        wait = REPLICA_WAIT if deadline is None else min(REPLICA_WAIT, deadline - time.monotonic())
        route.waiting += 1
        try:
            await asyncio.wait_for(route.back.wait(), max(0.0, wait))
        except TimeoutError:
            pass
        finally:
            route.waiting -= 1
        current = self.routes.get(key)
        if current is not None and (current.ready or current.stalled):
            return current
        status = self.table.get(key)
        if status is not None and status.state is not ModelState.READY:
            raise NotReady(status.describe())  # e.g. quarantined meanwhile
        raise NotReady(f"{route.describe()} has no ready replica: its workers are restarting")


def restarting(route: Route) -> Overloaded:
    """The refusal of a request past the bound of those waiting for a replica."""
    return Overloaded(f"{route.describe()} is overloaded: its workers are restarting")


def send(worker: WorkerHandle, header: bytes, body: bytes) -> None:
    """Put a request in ``worker``'s ring (bigger than a slot: its own memfd over the
    control channel), ringing its doorbell if it may be asleep; OSError if it died."""
    if worker.requests.push(header, body):
        if worker.requests.needs_bell():  # a busy worker finds it without one
            os.eventfd_write(worker.request_bell, 1)
    else:
        worker.post(Op.REQUEST, header, body)


def least_loaded(workers: list[WorkerHandle], max_queue: int) -> WorkerHandle | None:
    """The worker of ``workers`` with the fewest requests in flight and room for one more."""
    worker = min(workers, key=lambda candidate: len(candidate.inflight), default=None)
    return worker if worker is not None and len(worker.inflight) < max_queue else None
