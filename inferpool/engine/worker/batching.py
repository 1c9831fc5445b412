"""Adaptive batching inside a worker: which queued requests run together, and how their
payloads join.

A model with ``max_batch_size`` > 1 collects queued requests until it has that many or
its oldest has waited ``max_batch_time`` seconds (``Batcher``). Payloads of a group that
agree on every dimension but the first (same dtype, same outputs) share a ``join_key``:
the worker path (``path.py``) concatenates them, predicts once and splits the result back.
Without batching every request is due at once and runs on its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from inferpool.engine.worker.model import LoadedModel

if TYPE_CHECKING:
    from inferpool.engine.worker.path import Job


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


def join_key(payload: Any, outputs: list[str], position: int) -> Hashable:
    """Payloads with equal keys can be concatenated; others get a key of their own."""
    if isinstance(payload, np.ndarray) and payload.ndim >= 1:
        return ("array", payload.shape[1:], payload.dtype.str, tuple(outputs))
    if isinstance(payload, pd.DataFrame):
        dtypes = tuple(str(dtype) for dtype in payload.dtypes)
        return ("frame", tuple(payload.columns), dtypes, tuple(outputs))
    return ("alone", position)


def concatenate(payloads: list[Any]) -> Any:
    if isinstance(payloads[0], pd.DataFrame):
        return pd.concat(payloads, ignore_index=True)
    return np.concatenate(payloads)


def split(result: Mapping[str, Any], rows: list[int]) -> list[dict[str, Any]] | None:
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
