"""The frontend's side of a request: route it to a version, run it, count its outcome.

``Inference`` finds the version a request names in the model table, refuses it when that
version is not READY (or its deadline has passed), runs it where models run (the engine
client's ``_infer`` / ``_infer_stream``: in this process or in a worker) or through a
pipeline's plan, and counts every outcome in the version's statistics (``accounting.py``).
Routing problems raise; a model's own problems come back as a ``Reply``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any

from inferpool.engine.accounting import Accounting
from inferpool.engine.ipc.messages import Reply
from inferpool.engine.ipc.stream_ops import MORE
from inferpool.engine.pipelines.manager import Pipelines
from inferpool.engine.states import ModelKey, ModelState, ModelStatus, ModelTable, describe_key
from inferpool.engine.stats import PROTOCOL_OF_KIND, error_reason
from inferpool.errors import DeadlineExceeded, InferpoolError, ModelNotFound
from inferpool.settings import ServerSettings

# Seconds by which a deadline's timer may fire early (uvloop's timers are in milliseconds).
_TIMER_SLACK = 0.002

# Where models run: (key, kind, body, json_length, deadline) -> the reply; with the requests
# a client streams after the first (or None) -> the replies.
Run = Callable[[ModelKey, int, bytes, int | None, float | None], Coroutine[Any, Any, Reply]]
RunStream = Callable[
    [ModelKey, int, bytes, int | None, float | None, AsyncIterator[bytes] | None],
    AsyncGenerator[Reply, None],
]
# The refusal a request for a version would meet now at a full queue, or None (``refusal``).
Overload = Callable[[ModelKey], InferpoolError | None]


class Inference:
    """Routes, runs and counts the requests of one engine client."""

    def __init__(
        self,
        settings: ServerSettings,
        table: ModelTable,
        accounting: Accounting,
        pipelines: Pipelines,
        run: Run,
        run_stream: RunStream,
        overload: Overload,
    ) -> None:
        self.settings = settings
        self.table = table
        self.accounting = accounting
        self.pipelines = pipelines
        self._run = run
        self._run_stream = run_stream
        self._overload = overload

    def refusal(self, name: str, version: str | None, kind: int) -> InferpoolError | None:
        """The error a request would be refused with now, decided from its model name and
        version alone (its body unread): unknown (404), not READY, or every queue that could
        take it full (503); None when it would be admitted (its outcome is decided later).
        A refusal is counted in the version's statistics, as ``infer`` counts it. Pipelines
        and rate limits are left to ``infer`` (a limiter's check takes a token)."""
        try:
            status = self.table.find(name, version)
        except ModelNotFound as exc:
            return exc
        key = status.key
        if key in self.pipelines.plans:
            return None
        refusal: InferpoolError | None
        if status.state is not ModelState.READY:
            refusal = status.refusal()
        else:
            refusal = self._overload(key)
            if refusal is None:
                return None
        stats = self.accounting.of(key)
        stats.refuse(PROTOCOL_OF_KIND[kind], refusal.status, error_reason(refusal))
        return refusal

    async def infer(
        self,
        name: str,
        version: str | None,
        kind: int,
        body: bytes,
        json_length: int | None,
        deadline: float | None = None,
    ) -> Reply:
        """Run one raw request; routing problems raise, model problems come back as a Reply.

        ``deadline`` is a ``time.monotonic()`` instant (the same clock in every process on
        Linux): a request still waiting then is dropped before it reaches a model. Every
        outcome is counted in the version's statistics, except a 404 (no version to count
        it for).
        """
        status = self.table.find(name, version)
        key = status.key
        stats = self.accounting.of(key)
        protocol = PROTOCOL_OF_KIND[kind]
        started = time.perf_counter_ns()
        stats.in_flight += 1  # the in-flight gauge: in until answered, refused or cancelled
        plan = self.pipelines.plans.get(key)
        try:
            if plan is not None:
                self.pipelines.sync()  # its readiness follows its children's
            if status.state is not ModelState.READY:
                raise status.refusal() if plan is None else self.pipelines.refusal(plan, status)
            if status.limiter is not None:  # before any work is queued (rate_limits.py)
                status.limiter.check(describe_key(key))
            check_deadline(deadline)
            if plan is None:
                reply = await self._run(key, kind, body, json_length, deadline)
            else:
                reply = await self.pipelines.infer(plan, kind, body, json_length, deadline)
        except asyncio.CancelledError:
            # The frontend gave up on it: at its deadline (it answers 504), else because
            # the client went away (499). The deadline's timer is uvloop's, in whole
            # milliseconds: it may fire a hair before the deadline itself.
            late = deadline is not None and time.monotonic() >= deadline - _TIMER_SLACK
            stats.refuse(protocol, 504 if late else 499, "timeout" if late else "cancelled")
            raise
        except Exception as exc:
            code = exc.status if isinstance(exc, InferpoolError) else 500
            stats.refuse(protocol, code, error_reason(exc))
            raise
        finally:
            stats.in_flight -= 1
        self.accounting.count_reply(stats, protocol, reply, started)
        return reply

    async def infer_stream(
        self,
        name: str,
        version: str | None,
        kind: int,
        body: bytes,
        json_length: int | None,
        deadline: float | None = None,
        more: AsyncIterator[bytes] | None = None,
    ) -> AsyncGenerator[Reply, None]:
        """Run one streamed request (a ``STREAM_KINDS`` kind): its replies as they come.
        ``more`` (``Kind.GRPC_STREAM_IN``): the requests its client sends after it, taken by
        the same ``predict_stream`` (``engine/stream_feed.py``); no model timeout then.

        Each chunk is a 200 marked ``MORE``; the last reply an empty 200 or the error that
        ended the stream; a model that does not stream answers its one reply. Routing
        problems raise before the first reply. No chunk within the model's timeout: a 504,
        and its generator is closed (as when the caller stops). Counted once, at the end.
        """
        status = self.table.find(name, version)
        key = status.key
        stats = self.accounting.of(key)
        protocol = PROTOCOL_OF_KIND[kind]
        try:
            admit(status)
        except InferpoolError as refusal:
            stats.refuse(protocol, refusal.status, error_reason(refusal))
            raise
        check_deadline(deadline)
        timeout = self.chunk_timeout(status) if more is None else None
        started = time.perf_counter_ns()
        stats.in_flight += 1
        replies = self._run_stream(key, kind, body, json_length, deadline, more)
        last: Reply | None = None
        try:
            while True:
                try:
                    async with asyncio.timeout(timeout):
                        reply = await anext(replies)
                except TimeoutError:
                    reply = Reply.from_error(
                        DeadlineExceeded(
                            f"{describe_key(key)} produced no chunk within its timeout "
                            f"({timeout:g} s)"
                        )
                    )
                except StopAsyncIteration:
                    break
                last = reply
                yield reply
                if not reply.flags & MORE:
                    break
        finally:
            stats.in_flight -= 1
            await replies.aclose()
            if last is None or last.flags & MORE:  # it never ended: the caller went away
                stats.refuse(protocol, 499, "cancelled")
            else:
                self.accounting.count_reply(stats, protocol, last, started)

    def chunk_timeout(self, status: ModelStatus) -> float | None:
        """Seconds a version may take per chunk of a stream, or per predict on a predict
        thread (None: no limit): its own ``timeout``, else the server's ``model_timeout``."""
        settings = status.settings
        timeout = settings.timeout if settings is not None else None
        if timeout is None:
            timeout = self.settings.model_timeout
        return timeout if timeout > 0 else None


def admit(status: ModelStatus) -> None:
    """Refuse a request the version cannot take now: it is not READY, or the request is
    over the version's rate limit (``rate_limits.py``: 429, before any work is queued)."""
    if status.state is not ModelState.READY:
        raise status.refusal()
    if status.limiter is not None:
        status.limiter.check(describe_key(status.key))


def check_deadline(deadline: float | None) -> None:
    """Refuse a request whose deadline has passed (504 / DEADLINE_EXCEEDED)."""
    if deadline is not None and time.monotonic() > deadline:
        raise DeadlineExceeded("the request's deadline passed before it could run")
