"""The frontend's inference accounting: every version's statistics, and what they answer.

``Accounting`` owns the per-version ``ModelStats`` (``stats.py``: Triton's statistics
extension and the Prometheus counters), the histogram buckets they share, and the seconds
each version's last load took. The request path (``inference.py``) counts each outcome
here, the lifecycle (``lifecycle.py``) creates a version's statistics when it loads and
forgets them when it unloads, and /metrics and the statistics extension read them.
"""

from __future__ import annotations

import time
from typing import Any

from inferpool.engine.ipc.messages import Reply, StageTimes
from inferpool.engine.states import ModelKey, ModelTable
from inferpool.engine.stats import GRPC, Buckets, ModelStats, error_reason, reply_reason
from inferpool.errors import InferpoolError, NotReady
from inferpool.settings import ServerSettings


class Accounting:
    """Per model version: its statistics and its last load's duration."""

    def __init__(self, settings: ServerSettings, table: ModelTable) -> None:
        self.table = table
        self.stats: dict[ModelKey, ModelStats] = {}  # per version
        self.buckets = Buckets(
            tuple(settings.metrics_latency_buckets), tuple(settings.metrics_batch_buckets)
        )
        # Per version, the seconds its last load took (failed or not), for /metrics.
        self.load_seconds: dict[ModelKey, float] = {}
        # A 503 reply made in this process means that a worker died with the request.
        self._workers = settings.workers > 0

    # -- the lifecycle's ----------------------------------------------------------------------
    def loaded(self, key: ModelKey, seconds: float, ready: bool) -> None:
        """A load of the version ended after ``seconds``; ``ready``: it serves (its
        statistics start, or go on counting after a reload)."""
        self.load_seconds[key] = seconds
        if ready:
            self.stats.setdefault(key, ModelStats(self.buckets))

    def forget(self, key: ModelKey) -> None:
        """The version is unloaded: it has no statistics any more (as Triton's)."""
        self.stats.pop(key, None)
        self.load_seconds.pop(key, None)

    # -- the request path's -------------------------------------------------------------------
    def of(self, key: ModelKey) -> ModelStats:
        """The version's statistics (a version that is not READY gets them here; a READY
        one has them)."""
        stats = self.stats.get(key)
        if stats is None:
            stats = self.stats[key] = ModelStats(self.buckets)
        return stats

    def count_reply(self, stats: ModelStats, protocol: int, reply: Reply, started: int) -> None:
        """Count a request's (or a stream's last) reply, ``started`` at that
        ``perf_counter_ns``."""
        elapsed = time.perf_counter_ns() - started
        code = reply.status
        reason = "" if code < 400 else reply_reason(reply, self._workers)
        stats.record(protocol, code, elapsed, reply.times, reply.rows, reply.execution, reason)

    def record(
        self,
        key: ModelKey,
        ok: bool,
        started: int,
        times: StageTimes | None,
        rows: int = 1,
        execution: int = 1,
        error: BaseException | None = None,
    ) -> None:
        """Count a request of ``rows`` inferences that began at ``started`` (perf_counter_ns)
        and ran in an execution of ``execution`` rows (``Reply.execution``), or failed with
        ``error``, in its version's statistics (none once the version is unloaded). The
        typed path of the embedded Engine counts as gRPC, the wire format it takes with
        workers."""
        stats = self.stats.get(key)
        if stats is None:
            return
        elapsed = time.perf_counter_ns() - started
        if ok:
            stats.record(GRPC, 200, elapsed, times, rows, execution)
        else:
            code = error.status if isinstance(error, InferpoolError) else 500
            reason = "internal" if error is None else error_reason(error)
            stats.record(GRPC, code, elapsed, times, rows, execution, reason)

    # -- the readers' -------------------------------------------------------------------------
    def running(self) -> dict[ModelKey, int]:
        """Per version, its in-flight requests (those the engine accepted and has not
        answered yet)."""
        return {key: stats.in_flight for key, stats in self.stats.items() if stats.in_flight}

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics extension: every model, one model's versions (all of them
        when ``version`` is None, as Triton), or one version. Unloaded versions have none
        (as Triton, which counts loaded models only): left out of the lists, 503 when
        named (or when every version of the model named is unloaded)."""
        table = self.table
        if name and version is None:
            listed = table.versions(name) or [table.find(name)]  # 404 if unknown
            statuses = [s for s in listed if not s.unloaded]
            if not statuses:
                raise NotReady(listed[0].describe())
        elif name:
            status = table.find(name, version)
            if status.unloaded:
                raise NotReady(status.describe())
            statuses = [status]
        else:
            statuses = [s for s in table.all() if not s.unloaded]
        return {
            "model_stats": [
                self.stats.get(s.key, ModelStats(self.buckets)).to_triton(s.name, s.version)
                for s in statuses
            ]
        }
