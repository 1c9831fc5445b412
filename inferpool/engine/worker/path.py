"""The one worker path: raw request bodies in, a reply for each out. A single request is a
group of one; a worker (and ``workers=0``) runs every request through ``run_executions``
(``run_group`` collects its replies).

For each job of a group, in order: refuse it if its deadline has passed, decode its body,
prepare the runtime's payload; then predict once per set of payloads that can be joined,
up to the model's batch rows (``batching.BatchPolicy``; a failing joined predict falls
back to one predict per request, so that a bad request does not fail the others); then
encode each result in its request's wire format. The replies of each execution are handed
out as soon as it is done, so that a request does not wait for the executions after its
own. A custom endpoint (``Kind.CUSTOM``: a runtime's own, MLflow's scoring endpoints,
``explain`` or a feedback) is called on its own (``endpoints``). Every stage is timed on
one clock (``time.monotonic_ns``, the clock of the header's ``enqueued_ns``) into the
reply's ``StageTimes``, the same way for one request as for a batch, and each reply says
how many rows its request held and the rows of the execution (one predict) it ran in,
for Triton's statistics, and the replies of requests predicted together share an
execution id, which tracing links. Whatever a job raises becomes its reply through
``Reply.from_error``; ``run_executions`` never raises.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from inferpool.engine.ipc.messages import Kind, Reply, RequestHeader, StageTimes
from inferpool.engine.worker import batching, inference
from inferpool.engine.worker.endpoints import call_custom
from inferpool.engine.worker.model import LoadedModel
from inferpool.engine.worker.wire_formats import wire_format
from inferpool.errors import DeadlineExceeded
from inferpool.protocol.types import InferenceRequest

logger = logging.getLogger(__name__)

_EXPIRED = "the request's deadline passed while it was queued"

# Ids of the executions that join several requests (``Reply.execution_id``), 1 to 2**32 - 1.
_EXECUTIONS = itertools.count()


class Job:
    """One request for a model: what the path reads of its header, and its body."""

    __slots__ = (
        "body", "deadline_ns", "enqueued_ns", "json_length", "kind", "model_index", "rank",
        "request_id",
    )  # fmt: skip

    def __init__(self, header: RequestHeader, body: bytes) -> None:
        # Plain attributes: the path reads them several times per request.
        (
            self.request_id, self.model_index, self.kind, self.json_length,
            self.deadline_ns, self.enqueued_ns, _,
        ) = header  # fmt: skip
        self.body = body
        self.rank = 0  # its priority level in its model's queue (``batching.Batcher``)


@dataclass(slots=True)
class _Decoded:
    """A job between decoding and encoding; ``times`` gets each stage as it ends."""

    position: int  # in the group
    kind: int
    request: InferenceRequest
    payload: Any
    outputs: list[str]
    rows: int  # ``rows_of(payload)``
    times: StageTimes


def run_group(model: LoadedModel, jobs: Sequence[Job]) -> list[Reply]:
    """The reply for each job, in order; never raises."""
    replies: list[Reply | None] = [None] * len(jobs)
    for positions, answers in run_executions(model, jobs):
        for position, reply in zip(positions, answers, strict=True):
            replies[position] = reply
    return cast(list[Reply], replies)  # every position is answered by now


def run_executions(
    model: LoadedModel, jobs: Sequence[Job]
) -> Iterator[tuple[list[int], list[Reply]]]:
    """The replies of ``jobs`` as they are ready, with their positions: after each
    execution (one predict, or the requests of a joined predict that failed, each alone)
    and at once for a job that does not run (expired, undecodable, a custom endpoint).
    Never raises.

    Payloads are joined only when the model batches (``model.batching``): jobs are
    decoded in order, and a set of joinable payloads runs as soon as it holds the
    policy's rows, or when the next payload would take it past them (a payload of more
    rows than that runs alone); the sets still open run at the end, oldest first.
    """
    limit = model.batching.rows if len(jobs) > 1 else 1
    sets: dict[Hashable, _Set] = {}
    for position, job in enumerate(jobs):
        started = time.monotonic_ns()
        try:
            if job.deadline_ns and started > job.deadline_ns:
                raise DeadlineExceeded(_EXPIRED)
            if job.kind == Kind.CUSTOM:
                yield [position], [call_custom(model, job.body, job.enqueued_ns, started)]
                continue
            decoded = _decode(model, job, position, started)
        except Exception as exc:
            yield [position], [Reply.from_error(exc, model.name)]
            continue
        key = None
        if limit > 1:
            whole = model.runtime.joins_requests
            key = batching.join_key(decoded.payload, decoded.outputs, whole)
        if key is None:
            yield _execute(model, [decoded])
            continue
        joining = sets.get(key)
        if joining is not None and joining.rows + decoded.rows > limit:
            del sets[key]
            yield _execute(model, joining.members)
            joining = None
        if joining is None:
            joining = sets[key] = _Set()
        joining.add(decoded)
        if joining.rows >= limit:
            del sets[key]
            yield _execute(model, joining.members)
    for joining in sets.values():
        yield _execute(model, joining.members)


class _Set:
    """Decoded payloads that can be joined, and their rows."""

    __slots__ = ("members", "rows")

    def __init__(self) -> None:
        self.members: list[_Decoded] = []
        self.rows = 0

    def add(self, member: _Decoded) -> None:
        self.members.append(member)
        self.rows += member.rows


def _decode(model: LoadedModel, job: Job, position: int, started: int) -> _Decoded:
    request = wire_format(job.kind).decode(job.body, job.json_length)
    payload, outputs = inference.prepare(model, request)
    times = StageTimes(started - job.enqueued_ns, time.monotonic_ns() - started)
    return _Decoded(position, job.kind, request, payload, outputs, rows_of(payload), times)


def _execute(model: LoadedModel, members: list[_Decoded]) -> tuple[list[int], list[Reply]]:
    """Predict a set of joinable payloads: once for all of them, else one by one; the
    members' positions and replies."""
    positions = [member.position for member in members]
    if len(members) > 1:
        rows = [member.rows for member in members]
        parts = _predict_joined(model, members, rows)
        if parts is not None:
            return positions, _encode_joined(model, members, parts, sum(rows))
    replies = []
    for member in members:
        started = time.monotonic_ns()
        try:
            result = inference.predict(model, member.payload, member.outputs, member.request)
        except Exception as exc:
            replies.append(Reply.from_error(exc, model.name))
            continue
        member.times.compute_infer = time.monotonic_ns() - started
        replies.append(_encode(model, member, result, member.rows, member.rows))
    return positions, replies


def _encode_joined(
    model: LoadedModel, members: list[_Decoded], parts: list[dict[str, Any]], total: int
) -> list[Reply]:
    """The replies of one execution of ``total`` rows: its first successful reply counts
    the execution, the others only add their own stages to it (the sign says which)."""
    execution_id = next(_EXECUTIONS) % 0xFFFFFFFF + 1
    replies = [
        _encode(model, member, part, member.rows, -total, execution_id)
        for member, part in zip(members, parts, strict=True)
    ]
    for reply in replies:
        if reply.status == 200:
            reply.execution = total
            break
    return replies


def rows_of(payload: Any) -> int:
    """The inferences a payload holds (Triton's inference count): its rows, or one for a
    payload without a first dimension."""
    if isinstance(payload, np.ndarray | pd.DataFrame) and payload.ndim >= 1:
        return len(payload)
    return 1


def _predict_joined(
    model: LoadedModel, members: list[_Decoded], rows: list[int]
) -> list[dict[str, Any]] | None:
    """Each member's part of one predict on the joined payloads; None when that fails or
    the result cannot be split by rows (the caller then predicts each alone)."""
    parts: list[dict[str, Any]] | None
    try:
        if model.runtime.joins_requests:  # it joins and splits whole requests itself
            payloads = [member.payload for member in members]
            started = time.monotonic_ns()
            parts = model.runtime.predict_requests(payloads, members[0].outputs)
            infer_ns = time.monotonic_ns() - started
        else:
            joined = batching.concatenate([member.payload for member in members])
            started = time.monotonic_ns()
            result = inference.predict(model, joined, members[0].outputs)
            infer_ns = time.monotonic_ns() - started
            parts = batching.split(result, rows)
    except Exception:
        return None  # one bad request must not fail the others: they run one by one
    if parts is not None:
        for member in members:
            member.times.compute_infer = infer_ns
    return parts


def _encode(
    model: LoadedModel,
    member: _Decoded,
    result: Any,
    rows: int,
    execution: int,
    execution_id: int = 0,
) -> Reply:
    started = time.monotonic_ns()
    try:
        response = inference.respond(model, member.request, result)
        body, json_length = wire_format(member.kind).encode(response, member.request)
    except Exception as exc:
        return Reply.from_error(exc, model.name)
    member.times.compute_output = time.monotonic_ns() - started
    return Reply(200, body, json_length, member.times, rows, execution, execution_id)
