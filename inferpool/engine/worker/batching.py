"""Adaptive batching inside a worker: queue requests per model, run them in groups.

A model with ``max_batch_size`` > 1 collects queued requests until it has that many or
its oldest has waited ``max_batch_time`` seconds. Requests of a group whose payloads
agree on every dimension but the first (same dtype, same outputs) are concatenated,
predicted once and split back; the others run one by one. Without batching every
request runs on its own, exactly as ``handler.handle`` runs it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from inferpool.engine.stats import StageTimes
from inferpool.engine.worker import inference
from inferpool.engine.worker.handler import KIND_CUSTOM, Reply, failure, handle, wire_format
from inferpool.engine.worker.model import LoadedModel

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Job:
    """One request waiting in a worker."""

    request_id: int
    model_index: int
    kind: int
    body: bytes
    json_length: int | None
    deadline_ns: int  # 0: none
    enqueued_ns: int  # when the frontend sent it (monotonic)


class Batcher:
    """Queued jobs per model; hands out the groups that are due."""

    def __init__(self) -> None:
        self._queues: dict[int, tuple[LoadedModel, list[Job]]] = {}

    def add(self, model: LoadedModel, job: Job) -> None:
        entry = self._queues.get(job.model_index)
        if entry is None:
            self._queues[job.model_index] = (model, [job])
        else:
            entry[1].append(job)

    def __len__(self) -> int:
        return sum(len(jobs) for _, jobs in self._queues.values())

    def cancel(self, request_id: int) -> Job | None:
        """Take a job that has not started out of its queue (its caller went away)."""
        for index, (_, jobs) in self._queues.items():
            for position, job in enumerate(jobs):
                if job.request_id == request_id:
                    del jobs[position]
                    if not jobs:
                        del self._queues[index]
                    return job
        return None

    def due(self, now_ns: int, flush: bool = False) -> list[tuple[LoadedModel, list[Job]]]:
        """Groups to run now; ``flush`` takes everything (shutdown)."""
        groups = []
        for index in list(self._queues):
            model, jobs = self._queues[index]
            size, wait_ns = _batch_limits(model)
            if size <= 1 or flush:
                groups.append((model, jobs))
                del self._queues[index]
                continue
            while len(jobs) >= size:
                groups.append((model, jobs[:size]))
                del jobs[:size]
            if jobs and now_ns - jobs[0].enqueued_ns >= wait_ns:
                groups.append((model, list(jobs)))
                jobs.clear()
            if not jobs:
                del self._queues[index]
        return groups

    def timeout(self, now_ns: int) -> float | None:
        """Seconds until the next partial batch is due, or None when nothing waits."""
        waits = []
        for model, jobs in self._queues.values():
            _, wait_ns = _batch_limits(model)
            waits.append(max(0, jobs[0].enqueued_ns + wait_ns - now_ns) / 1e9)
        return min(waits) if waits else None


def _batch_limits(model: LoadedModel) -> tuple[int, int]:
    settings = model.settings
    return settings.max_batch_size, int(settings.max_batch_time * 1e9)


def _expired(job: Job, now_ns: int) -> bool:
    return job.deadline_ns != 0 and now_ns > job.deadline_ns


_EXPIRED = "the request's deadline passed while it was queued"


def run_group(model: LoadedModel, jobs: list[Job]) -> list[Reply]:
    """The reply for each job, in order; never raises."""
    if len(jobs) == 1 or model.settings.max_batch_size <= 1:
        return [_run_one(model, job) for job in jobs]
    return _run_batched(model, jobs)


def _run_one(model: LoadedModel, job: Job) -> Reply:
    started = time.monotonic_ns()
    if _expired(job, started):
        return Reply(504, _EXPIRED.encode())
    reply = handle(model, job.kind, job.body, job.json_length)
    if reply.times is not None:
        reply.times.queue = started - job.enqueued_ns
    return reply


@dataclass(slots=True)
class _Prepared:
    position: int
    job: Job
    request: Any
    payload: Any
    outputs: list[str]
    queue_ns: int
    decode_ns: int


def _run_batched(model: LoadedModel, jobs: list[Job]) -> list[Reply]:
    replies: dict[int, Reply] = {}
    groups: dict[Hashable, list[_Prepared]] = {}
    for position, job in enumerate(jobs):
        started = time.monotonic_ns()
        if _expired(job, started):
            replies[position] = Reply(504, _EXPIRED.encode())
            continue
        if job.kind == KIND_CUSTOM:
            replies[position] = handle(model, job.kind, job.body, job.json_length)
            continue
        try:
            decode, _ = wire_format(job.kind)
            request = decode(job.body, job.json_length)
            payload, outputs = inference.prepare(model, request)
        except Exception as exc:
            replies[position] = failure(model, exc)
            continue
        decode_ns = time.monotonic_ns() - started
        prepared = _Prepared(
            position, job, request, payload, outputs, started - job.enqueued_ns, decode_ns
        )
        groups.setdefault(_batch_key(payload, outputs, position), []).append(prepared)
    for members in groups.values():
        for item, reply in zip(members, _predict_group(model, members), strict=True):
            replies[item.position] = reply
    return [replies[position] for position in range(len(jobs))]


def _batch_key(payload: Any, outputs: list[str], position: int) -> Hashable:
    """Payloads with equal keys can be concatenated; others get a key of their own."""
    if isinstance(payload, np.ndarray) and payload.ndim >= 1:
        return ("array", payload.shape[1:], payload.dtype.str, tuple(outputs))
    if isinstance(payload, pd.DataFrame):
        dtypes = tuple(str(dtype) for dtype in payload.dtypes)
        return ("frame", tuple(payload.columns), dtypes, tuple(outputs))
    return ("alone", position)


def _predict_group(model: LoadedModel, members: list[_Prepared]) -> list[Reply]:
    if len(members) > 1:
        rows = [len(item.payload) for item in members]
        try:
            joined = _concatenate([item.payload for item in members])
            started = time.monotonic_ns()
            result = inference.predict(model, joined, members[0].outputs)
            infer_ns = time.monotonic_ns() - started
            parts = _split(result, rows)
        except Exception:
            parts = None  # one bad request must not fail the others: run them one by one
        if parts is not None:
            pairs = zip(members, parts, strict=True)
            return [_finish(model, item, part, infer_ns) for item, part in pairs]
    replies = []
    for item in members:
        try:
            started = time.monotonic_ns()
            result = inference.predict(model, item.payload, item.outputs, item.request)
        except Exception as exc:
            replies.append(failure(model, exc))
            continue
        replies.append(_finish(model, item, result, time.monotonic_ns() - started))
    return replies


def _concatenate(payloads: list[Any]) -> Any:
    if isinstance(payloads[0], pd.DataFrame):
        return pd.concat(payloads, ignore_index=True)
    return np.concatenate(payloads)


def _split(result: Mapping[str, Any], rows: list[int]) -> list[dict[str, Any]] | None:
    """Each request's rows of every output, or None when an output is not per-row."""
    total = sum(rows)
    bounds = np.cumsum([0, *rows])
    parts: list[dict[str, Any]] = [{} for _ in rows]
    for name, value in result.items():
        if isinstance(value, pd.DataFrame | pd.Series):
            take = value.iloc
        elif isinstance(value, np.ndarray | list) and np.ndim(value) >= 1:
            take = value
        else:
            return None
        if len(value) != total:
            return None
        for i in range(len(rows)):
            parts[i][name] = take[bounds[i] : bounds[i + 1]]
    return parts


def _finish(model: LoadedModel, item: _Prepared, result: Any, infer_ns: int) -> Reply:
    started = time.monotonic_ns()
    try:
        _, encode = wire_format(item.job.kind)
        response = inference.respond(model, item.request, result)
        body, json_length = encode(response, item.request)
    except Exception as exc:
        return failure(model, exc)
    times = StageTimes(item.queue_ns, item.decode_ns, infer_ns, time.monotonic_ns() - started)
    return Reply(200, body, json_length, times)
