"""Batching inside a worker: which queued requests run together, and how their payloads
join.

``policy`` decides once per loaded model how it batches (``BatchPolicy``): a model whose
runtime predicts each row on its own (``Runtime.rows_independent``: the built-in
runtimes) batches by default, with no added wait; any other does only when its settings
ask (``max_batch_size`` > 1). ``max_batch_size`` counts rows: no predict joins more,
although a single request larger than that runs alone. ``max_batch_time`` > 0 lets a
request wait up to that long for others (MLServer's adaptive batching); 0 never holds a
request back: what is queued when the worker looks runs together, a request alone runs
at once.

``Batcher`` holds a worker's queued requests per model and hands out those that are due.
Each model's queue is kept in priority order (``Job.rank``: the level the request asked
for, ``protocol/priority.py``, else its model's default), first come first served within a
level: a request that asks for no priority is appended, as before, unless the queue's last
one ranks below it. A model that never waits gets at most one execution's worth per call
(its rows, one request when it does not join), so the worker takes what arrived meanwhile
into the queue before the next execution, and a higher priority one runs next.
Payloads that agree on every dimension but the first (same dtype, same outputs) share a
``join_key``: the worker path (``path.py``) concatenates them up to the policy's rows,
predicts once and splits the result back. A runtime that ``joins_requests`` (an MLServer
custom runtime with adaptive batching) joins whole requests itself, each counting one row,
so that ``max_batch_size`` counts requests as in MLServer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from inferpool.runtimes.base import Runtime
from inferpool.settings import ModelSettings

if TYPE_CHECKING:
    from inferpool.engine.worker.model import LoadedModel
    from inferpool.engine.worker.path import Job

# The rows one predict may join when the settings do not say (``max_batch_size`` 0). Big
# enough that a burst of small requests runs as one predict (64 clients of one row each
# here), small enough that a request never waits long for its neighbours' rows: a
# 256-row predict costs a linear model tens of microseconds and a 100-tree forest a few
# milliseconds. A request of 256 rows or more runs alone.
AUTO_BATCH_ROWS = 256
# The rank of a request that asks for no priority, when its model sets no default level:
# below every level a request may ask for (``priority.MAX_LEVEL``).
DEFAULT_RANK = 0x10000


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How a model batches: ``rows``, the most rows one predict joins (1: it never joins
    requests), and ``wait_ns``, how long a request may wait for others (0: never)."""

    rows: int
    wait_ns: int = 0

    @property
    def joins(self) -> bool:
        return self.rows > 1


NO_BATCHING = BatchPolicy(1)


def policy(settings: ModelSettings, runtime: Runtime) -> BatchPolicy:
    """The model's batching: its settings when they set ``max_batch_size``, else
    ``AUTO_BATCH_ROWS`` with no wait for a runtime whose rows are independent, else none.

    ``max_batch_time`` applies only with ``max_batch_size`` > 1, as in MLServer (whose
    adaptive batching needs both). A negative size is "off" too: MLServer accepts it and
    then never batches, so a migrated repository keeps loading.
    """
    size = settings.max_batch_size
    if size == 0:
        return BatchPolicy(AUTO_BATCH_ROWS) if runtime.rows_independent else NO_BATCHING
    if size <= 1:
        return NO_BATCHING
    return BatchPolicy(size, int(settings.max_batch_time * 1e9))


class Batcher:
    """Queued jobs per model; hands out the groups that are due."""

    def __init__(self) -> None:
        self._queues: dict[int, tuple[LoadedModel, list[Job]]] = {}

    def add(self, model: LoadedModel, job: Job) -> None:
        """Queue ``job`` behind those of its rank or above (``job.rank`` is set)."""
        entry = self._queues.get(job.model_index)
        if entry is None:
            self._queues[job.model_index] = (model, [job])
            return
        jobs = entry[1]
        rank = job.rank
        if jobs[-1].rank <= rank:  # the common case: no priorities, or the lowest
            jobs.append(job)
            return
        position = len(jobs) - 1
        while position > 0 and jobs[position - 1].rank > rank:
            position -= 1
        jobs.insert(position, job)

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
        """Groups to run now; ``flush`` takes everything (shutdown).

        Without a wait the first jobs up to the policy's rows are due (the path joins
        them; one when the model does not join), the rest at the next call. With one, a
        group is due when its oldest job has waited long enough, or when it holds as many
        jobs as the policy's rows: each job holds a row at least, so they fill a predict
        (the rows are known only once decoded, in the path).
        """
        groups = []
        for index in list(self._queues):
            model, jobs = self._queues[index]
            rows, wait_ns = model.batching.rows, model.batching.wait_ns
            if flush or ((wait_ns == 0 or rows <= 1) and len(jobs) <= rows):
                groups.append((model, jobs))
                del self._queues[index]
                continue
            if wait_ns == 0 or rows <= 1:  # one execution now; the ring is read before more
                groups.append((model, jobs[:rows]))
                del jobs[:rows]
                continue
            while len(jobs) >= rows:
                groups.append((model, jobs[:rows]))
                del jobs[:rows]
            if jobs and now_ns - jobs[0].enqueued_ns >= wait_ns:
                groups.append((model, list(jobs)))
                jobs.clear()
            if not jobs:
                del self._queues[index]
        return groups

    @contextlib.contextmanager
    def holding(self, indexes: Iterable[int]) -> Iterator[None]:
        """Within, the queues of these model indexes are out of sight (``due`` and
        ``timeout`` skip them): their model waits in a call (``calls.py``). Nothing may be
        added within."""
        held = {index: self._queues.pop(index) for index in indexes if index in self._queues}
        try:
            yield
        finally:
            self._queues.update(held)

    def timeout(self, now_ns: int) -> float | None:
        """Seconds until the next partial batch is due, or None when nothing waits."""
        waits = []
        for model, jobs in self._queues.values():
            wait_ns = model.batching.wait_ns
            waits.append(max(0, jobs[0].enqueued_ns + wait_ns - now_ns) / 1e9)
        return min(waits) if waits else None


def join_key(payload: Any, outputs: list[str], whole: bool = False) -> Hashable | None:
    """Payloads with equal keys can be concatenated; None for one that joins no other
    (a dict of inputs, a whole request, a scalar). ``whole``: the runtime joins whole
    requests itself (``Runtime.joins_requests``), those asking for the same outputs."""
    if whole:
        return ("requests", tuple(outputs))
    if isinstance(payload, np.ndarray) and payload.ndim >= 1:
        return ("array", payload.shape[1:], payload.dtype.str, tuple(outputs))
    if isinstance(payload, pd.DataFrame):
        dtypes = tuple(str(dtype) for dtype in payload.dtypes)
        return ("frame", tuple(payload.columns), dtypes, tuple(outputs))
    return None


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
