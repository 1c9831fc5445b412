"""Per-model inference statistics: Triton's statistics extension, and the counters and
histograms that /metrics exposes (``frontends/metrics.py`` reads them at scrape time).

Triton's definitions: ``inference_count`` counts inferences (rows: a request of 3 rows is
3), ``execution_count`` counts model executions (requests predicted together are one),
``inference_stats.success.count`` counts requests, and ``batch_stats`` lists, per executed
batch size (rows), how many executions had that size and the time their stages took.
Beside them, ``in_flight``: the requests of the version in the engine right now.

For Prometheus, each version counts its requests by protocol and status, its failures by
reason class, and keeps histograms of the request duration (per protocol), of each stage's
time (from the worker's ``StageTimes``) and of the rows per execution. All of it is
recorded in the frontend process from what the reply carries: a histogram observation is
a bisect and two additions, on plain lists, without a lock (one event loop records and
answers the scrape).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inferpool.engine.ipc.messages import Kind, Reply, StageTimes
from inferpool.errors import (
    InferpoolError,
    ModelError,
    ModelNotFound,
    Overloaded,
    RateLimited,
    WorkerLost,
)
from inferpool.settings import BATCH_BUCKETS, LATENCY_BUCKETS

STAGES = ("queue", "compute_input", "compute_infer", "compute_output")

# The protocols /metrics tells apart, by index, and each request Kind's protocol: a custom
# endpoint is REST's; the embedded Engine's typed path counts as gRPC, the wire format its
# requests take with workers, so that its labels do not depend on the worker count.
PROTOCOLS = ("rest", "grpc")
REST, GRPC = 0, 1
_PROTOCOL_OF_KIND = {
    Kind.REST: REST,
    Kind.GRPC: GRPC,
    Kind.CUSTOM: REST,
    Kind.REST_HEADERS: REST,
    Kind.GRPC_HEADERS: GRPC,
    Kind.REST_STREAM: REST,
    Kind.GRPC_STREAM: GRPC,
    Kind.GENERATE: REST,
    Kind.GENERATE_STREAM: REST,
    Kind.GRPC_STREAM_IN: GRPC,
    Kind.REST_SHM: REST,
    Kind.GRPC_SHM: GRPC,
}
PROTOCOL_OF_KIND = tuple(_PROTOCOL_OF_KIND[kind] for kind in sorted(Kind))

# Failure reason classes (docs/operate/metrics.md says what each one means).
REASONS = (
    "invalid_input", "model_error", "timeout", "overloaded", "unavailable", "worker_lost",
    "cancelled", "internal", "rate_limited",
)  # fmt: skip
# ``Reply.from_error``'s message for an exception that is not an InferpoolError.
_INTERNAL = b"internal error:"


class Histogram:
    """Counts of observations per bucket (``counts[i]``: values ``<= bounds[i]`` and above
    the bound before; the last count: above every bound) and their sum, in the unit the
    bounds are in. Not cumulative: ``cumulative`` turns it into Prometheus's buckets."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds  # sorted upper bounds, shared by every histogram of a kind
        self.counts = [0] * (len(bounds) + 1)
        self.total: float = 0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (``le``).
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[int]:
        """The count at or below each bound, then the count of all (``+Inf``)."""
        running, out = 0, []
        for count in self.counts:
            running += count
            out.append(running)
        return out


@dataclass(frozen=True, slots=True)
class Buckets:
    """The bounds every version's histograms share (settings ``metrics_*_buckets``)."""

    latency: tuple[float, ...] = LATENCY_BUCKETS  # seconds, as exposed
    rows: tuple[float, ...] = BATCH_BUCKETS
    latency_ns: tuple[int, ...] = field(init=False)  # what is observed: nanoseconds

    def __post_init__(self) -> None:
        object.__setattr__(self, "latency_ns", tuple(round(b * 1e9) for b in self.latency))


_DEFAULT_BUCKETS = Buckets()


@dataclass(slots=True)
class BatchStats:
    """The executions of one batch size: how many, and their stages' nanoseconds."""

    count: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0

    def to_triton(self, size: int) -> dict[str, Any]:
        return {
            "batch_size": size,
            "compute_input": {"count": self.count, "ns": self.input_ns},
            "compute_infer": {"count": self.count, "ns": self.infer_ns},
            "compute_output": {"count": self.count, "ns": self.output_ns},
        }


class ModelStats:
    """One model version's statistics (Triton's) and its Prometheus counters."""

    __slots__ = (
        "batch_rows", "batches", "buckets", "codes", "durations", "endpoint_codes",
        "execution_count", "fail", "fail_ns", "failures", "feedback_count", "feedback_reward",
        "in_flight", "inference_count", "last_inference_ms", "stages",
    )  # fmt: skip

    def __init__(self, buckets: Buckets = _DEFAULT_BUCKETS) -> None:
        self.buckets = buckets
        # A gauge, not a statistic: requests the engine has accepted for this version and
        # not answered yet (``EngineClient.infer`` counts them in and out; /metrics reads it).
        self.in_flight = 0
        self.fail = 0
        self.fail_ns = 0
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batches: dict[int, BatchStats] = {}
        # Prometheus: requests per protocol by HTTP status, failures by reason class.
        self.codes: tuple[dict[int, int], ...] = tuple({} for _ in PROTOCOLS)
        self.failures: dict[str, int] = {}
        latency = buckets.latency_ns
        self.durations = tuple(Histogram(latency) for _ in PROTOCOLS)
        self.stages = tuple(Histogram(latency) for _ in STAGES)
        self.batch_rows = Histogram(buckets.rows)
        # Custom endpoint calls by (protocol, path, method, status), the path one the model
        # registered (never a client's arbitrary string); feedbacks and their rewards.
        self.endpoint_codes: dict[tuple[str, str, str, int], int] = {}
        self.feedback_count = 0
        self.feedback_reward = 0.0

    def record(
        self,
        protocol: int,
        status: int,
        total_ns: int,
        times: StageTimes | None,
        rows: int = 1,
        execution: int = 1,
        reason: str = "",
    ) -> None:
        """Count one request of ``rows`` inferences answered ``status`` after ``total_ns``.

        ``execution`` is the rows of the model execution it ran in: positive when this
        request counts that execution, negative when another request of the same execution
        counts it (this one's decoding and encoding still add to the execution's times),
        0 when it did not run (``Reply.execution``). ``reason`` is the failure's class
        when ``status`` is an error (400 or above).
        """
        codes = self.codes[protocol]
        codes[status] = codes.get(status, 0) + 1
        self.last_inference_ms = time.time_ns() // 1_000_000
        if status >= 400:  # a custom endpoint may answer 201, 204, 302...
            self.fail += 1
            self.fail_ns += total_ns
            self.failures[reason] = self.failures.get(reason, 0) + 1
            return
        # Triton's success count and time, and its stage times, are these histograms'.
        self.durations[protocol].observe(total_ns)
        self.inference_count += rows
        if execution > 0:
            self.execution_count += 1
            self.batch_rows.observe(execution)
        if times is None:
            return
        queue, decode, predict, encode = self.stages
        queue.observe(times.queue)
        decode.observe(times.compute_input)
        predict.observe(times.compute_infer)
        encode.observe(times.compute_output)
        if execution:
            size = abs(execution)
            batch = self.batches.get(size)
            if batch is None:
                batch = self.batches[size] = BatchStats()
            batch.input_ns += times.compute_input
            batch.output_ns += times.compute_output
            if execution > 0:  # the execution's predict is counted once
                batch.count += 1
                batch.infer_ns += times.compute_infer

    def refuse(self, protocol: int, status: int, reason: str) -> None:
        """Count a request the engine did not answer with a reply (it raised: not ready,
        overloaded, past its deadline, cancelled...). Triton's statistics leave it out."""
        codes = self.codes[protocol]
        codes[status] = codes.get(status, 0) + 1
        self.failures[reason] = self.failures.get(reason, 0) + 1

    def to_triton(self, name: str, version: str | None) -> dict[str, Any]:
        stages = {
            stage: {"count": histogram.count, "ns": histogram.total}
            for stage, histogram in zip(STAGES, self.stages, strict=True)
        }
        success = sum(histogram.count for histogram in self.durations)
        success_ns = sum(histogram.total for histogram in self.durations)
        return {
            "name": name,
            "version": version or "",
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": {"count": success, "ns": success_ns},
                "fail": {"count": self.fail, "ns": self.fail_ns},
                **stages,
            },
            # A size whose counting reply has not come back yet waits for it.
            "batch_stats": [
                batch.to_triton(size) for size, batch in sorted(self.batches.items()) if batch.count
            ],
        }


def reply_reason(reply: Reply, workers: bool) -> str:
    """The failure class of a reply that is not a 200.

    A 503 reply made in the frontend (no stage times: a worker's replies always carry
    them) is ``WorkerHandle.close``'s or the dispatcher's answer for a worker that died
    with the request; a 503 a worker or the in-process path answers is a version it does
    not hold (unloaded meanwhile). A 500 is the model's fault unless ``Reply.from_error``
    wrapped an exception of the server's own.
    """
    status = reply.status
    if status == 503:
        return "worker_lost" if workers and reply.times is None else "unavailable"
    if status == 500:
        return "internal" if reply.body.startswith(_INTERNAL) else "model_error"
    return status_reason(status)


def error_reason(exc: BaseException) -> str:
    """The failure class of an error the engine raised instead of replying."""
    if isinstance(exc, Overloaded):
        return "overloaded"
    if isinstance(exc, RateLimited):
        return "rate_limited"
    if isinstance(exc, WorkerLost):
        return "worker_lost"
    if isinstance(exc, ModelError):
        return "model_error"
    if isinstance(exc, ModelNotFound):  # counted for a version only once it was unloaded
        return "unavailable"
    if isinstance(exc, InferpoolError):  # NotReady, DeadlineExceeded, ClientGone, 4xx
        return status_reason(exc.status)
    return "internal"


def status_reason(status: int) -> str:
    """The failure class an error status means, when nothing else tells it apart."""
    if status == 499:
        return "cancelled"
    if status == 504:
        return "timeout"
    if status == 503:
        return "unavailable"
    if 400 <= status < 500:
        return "invalid_input"
    return "internal"
