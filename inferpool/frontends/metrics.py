"""Prometheus metrics, read from the engine's statistics at scrape time.

The per-model collector lives here: ``EngineCollector`` turns what the engine keeps anyway
(``ModelStats``: counters and histograms recorded where a request is answered; the model
table; the pool's routes) into metric families when scraped; nothing here runs per
request. The two gauges an autoscaler reads (docs/deploy/autoscaling.md) come from the same
place: ``inferpool_model_in_flight_requests`` (accepted by the engine, not yet answered)
and ``inferpool_model_queued_requests`` (those of them that no worker runs yet: waiting for
a replica, in a worker's queue or its batcher; with ``--workers 0``, for a predict
thread or a batch). docs/operate/metrics.md lists every metric.

Each family is one row of ``FAMILIES`` (name, type, help, labels, how its samples are read
and for which models); ``EngineCollector.collect`` is a loop over that table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferpool.engine.client import EngineClient
from inferpool.engine.custom_metrics_sum import CustomMetricsCollector
from inferpool.engine.states import ModelState, ModelStatus
from inferpool.engine.stats import PROTOCOLS, REASONS, Histogram, ModelStats
from inferpool.errors import HTTP_OF_GRPC, grpc_code_for
from inferpool.frontends.metrics_server import ServerCollector

_NS = 1e-9
# The stages of ``StageTimes``, in ``ModelStats.stages``'s order, as /metrics names them.
_STAGES = ("queue", "decode", "predict", "encode")
_REPLICA_STATES = tuple(state.value.lower() for state in ModelState)
_KEY = ("model", "version")
# A family's sample: its label values after the model's (none for the server's) and its
# value, or a histogram's buckets and sum.
Sample = tuple[Any, ...]


@dataclass(slots=True)
class _Model:
    """One model version as a scrape reads it."""

    key: list[str]  # the values of the labels model and version ([]: the server)
    status: ModelStatus | None  # None: the server, for its own families
    stats: ModelStats | None  # None until the engine has counted a request of it
    running: int  # its requests a worker runs now

    @property
    def listed(self) -> ModelStatus:
        assert self.status is not None  # the "model" families read only models
        return self.status

    @property
    def counted(self) -> ModelStats:
        assert self.stats is not None  # the "stats" families read only the counted models
        return self.stats


_SERVER = _Model([], None, None, 0)


@dataclass(frozen=True, slots=True)
class Family:
    """A metric family of ``/metrics``: ``read`` gives its samples for one model of
    ``source`` (``model``: every version in the table; ``stats``: those the engine has
    counted requests of; ``server``: once, without the model's labels)."""

    name: str
    kind: type[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]
    help: str
    labels: tuple[str, ...]
    read: Callable[[EngineCollector, _Model], Iterable[Sample]]
    source: Literal["model", "stats", "server"] = "stats"


class EngineCollector(Collector):
    """Per-model requests, failures, latency, stage and batch histograms, replicas, load
    time, the load gauges, and readiness: the families of ``FAMILIES``, in its order."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        buckets = client.buckets
        self.latency_le = [*map(floatToGoString, buckets.latency), "+Inf"]
        self.rows_le = [*map(floatToGoString, buckets.rows), "+Inf"]

    def collect(self) -> Iterator[Metric]:
        client = self.client
        running = client.running_requests()
        models = [
            _Model(
                [status.name, status.version or ""],
                status,
                client.stats.get(status.key),
                running.get(status.key, 0),
            )
            for status in client.table.all()
        ]
        for spec in FAMILIES:
            family = spec.kind(spec.name, spec.help, labels=spec.labels)
            for model in (_SERVER,) if spec.source == "server" else models:
                if spec.source == "stats" and model.stats is None:
                    continue
                for labels, *value in spec.read(self, model):
                    family.add_metric([*model.key, *labels], *value)
            yield family

    def replicas(self, status: ModelStatus) -> dict[str, int]:
        """The version's replicas by state. In the pool, a version with a route counts its
        ready replicas and, as loading, the worker slots meant to hold one that do not
        (their worker is being replaced or is loading it again); a version without one
        (loading for the first time, failed, unloading) counts the replicas it asked for
        under its own state. In-process a version is one replica in its state."""
        counts = dict.fromkeys(_REPLICA_STATES, 0)
        client = self.client
        pool = client.worker_pool()
        route = pool.routes.get(status.key) if pool is not None else None
        if route is not None and status.state in (ModelState.READY, ModelState.LOADING):
            ready = sum(1 for worker in route.ready if worker.alive)
            counts["ready"] = ready
            counts["loading"] = max(0, len(route.slots) - ready)
            return counts
        wanted = 1
        if client.settings.workers > 0 and status.settings is not None:
            wanted = status.settings.replicas or client.settings.workers
        counts[status.state.value.lower()] = wanted
        return counts


def _histogram(histogram: Histogram, bounds: Sequence[str], unit: float) -> Sample:
    """A histogram's buckets (cumulative, by bound) and sum, in ``unit``."""
    return list(zip(bounds, histogram.cumulative(), strict=True)), histogram.total * unit


def _requests(collector: EngineCollector, model: _Model) -> Iterator[Sample]:
    for protocol, codes in zip(PROTOCOLS, model.counted.codes, strict=True):
        for code, count in _code_counts(protocol, codes).items():
            yield (protocol, code), count


def _durations(collector: EngineCollector, model: _Model) -> Iterator[Sample]:
    for protocol, histogram in zip(PROTOCOLS, model.counted.durations, strict=True):
        yield (protocol,), *_histogram(histogram, collector.latency_le, _NS)


def _stages(collector: EngineCollector, model: _Model) -> Iterator[Sample]:
    for stage, histogram in zip(_STAGES, model.counted.stages, strict=True):
        yield (stage,), *_histogram(histogram, collector.latency_le, _NS)


def _load(collector: EngineCollector, model: _Model) -> Iterator[Sample]:
    seconds = collector.client.load_seconds.get(model.listed.key)
    if seconds is not None:
        yield (), seconds


def _endpoint_calls(collector: EngineCollector, model: _Model) -> Iterator[Sample]:
    for (via, path, method, answered), count in model.counted.endpoint_codes.items():
        yield (via, "/" + path, method, str(answered)), count


# Every family of the engine's, in the order /metrics shows them.
FAMILIES = (
    Family(
        "inferpool_model_requests",
        CounterMetricFamily,
        "Inference requests by protocol and outcome (HTTP status; gRPC's mapped to one)",
        (*_KEY, "protocol", "code"),
        _requests,
    ),
    Family(
        "inferpool_model_failures",
        CounterMetricFamily,
        "Inference requests that failed, by reason class",
        (*_KEY, "reason"),
        lambda _, model: [((r,), model.counted.failures.get(r, 0)) for r in REASONS],
    ),
    Family(
        "inferpool_model_rate_limited_requests",
        CounterMetricFamily,
        "Inference requests refused (429) by the model's rate limit",
        _KEY,
        lambda _, model: [((), model.counted.failures.get("rate_limited", 0))],
    ),
    Family(
        "inferpool_model_request_duration_seconds",
        HistogramMetricFamily,
        "Time from the engine accepting a request to its reply, successful requests",
        (*_KEY, "protocol"),
        _durations,
    ),
    Family(
        "inferpool_model_stage_duration_seconds",
        HistogramMetricFamily,
        "Time per stage of successful requests: queue, decode, predict, encode",
        (*_KEY, "stage"),
        _stages,
    ),
    Family(
        "inferpool_model_batch_size_rows",
        HistogramMetricFamily,
        "Rows per model execution (one predict, batched requests together)",
        _KEY,
        lambda c, model: [((), *_histogram(model.counted.batch_rows, c.rows_le, 1))],
    ),
    Family(
        "inferpool_model_replicas",
        GaugeMetricFamily,
        "Replicas of the model version by state",
        (*_KEY, "state"),
        lambda c, model: [((state,), n) for state, n in c.replicas(model.listed).items()],
        source="model",
    ),
    Family(
        "inferpool_model_load_duration_seconds",
        GaugeMetricFamily,
        "Seconds the version's last load took (failed or not)",
        _KEY,
        _load,
        source="model",
    ),
    Family(
        "inferpool_model_ready",
        GaugeMetricFamily,
        "1 when the model is READY",
        _KEY,
        lambda _, model: [((), 1.0 if model.listed.state is ModelState.READY else 0.0)],
        source="model",
    ),
    Family(
        "inferpool_model_in_flight_requests",
        GaugeMetricFamily,
        "Requests accepted by the engine and not yet answered, queued ones included",
        _KEY,
        lambda _, model: [((), model.counted.in_flight)],
    ),
    Family(
        "inferpool_model_queued_requests",
        GaugeMetricFamily,
        "In-flight requests not yet picked by a worker (waiting for a replica or queued)",
        _KEY,
        # A cancelled request is out of in_flight while a worker may still run it.
        lambda _, model: [((), max(0, model.counted.in_flight - model.running))],
    ),
    Family(
        "inferpool_server_ready",
        GaugeMetricFamily,
        "1 when the server is ready (strict readiness)",
        (),
        lambda c, _: [((), 1.0 if c.client.not_ready_reason() is None else 0.0)],
        source="server",
    ),
    Family(
        "inferpool_model_endpoint_requests",
        CounterMetricFamily,
        "Custom endpoint calls by protocol, registered path, method and HTTP status",
        (*_KEY, "protocol", "path", "method", "code"),
        _endpoint_calls,
    ),
    Family(
        "inferpool_model_feedback",
        CounterMetricFamily,
        "Feedbacks the model took (2xx)",
        _KEY,
        lambda _, model: [((), model.counted.feedback_count)],
    ),
    Family(
        "inferpool_model_feedback_reward_sum",
        GaugeMetricFamily,
        "Sum of the rewards of the feedbacks the model took",
        _KEY,
        lambda _, model: [((), model.counted.feedback_reward)],
    ),
)


def _code_counts(protocol: str, codes: dict[int, int]) -> dict[str, int]:
    """Counts by the ``code`` label: the HTTP status, or for gRPC the HTTP status of the
    gRPC status its client got (several HTTP statuses share one gRPC status)."""
    if protocol != "grpc":
        return {str(status): count for status, count in codes.items()}
    labelled: dict[str, int] = {}
    for status, count in codes.items():
        code = str(HTTP_OF_GRPC.get(grpc_code_for(status), 500))
        labelled[code] = labelled.get(code, 0) + count
    return labelled


def build_metrics_app(client: EngineClient) -> Starlette:
    """``GET /metrics`` in Prometheus's text format."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(client))
    registry.register(ServerCollector(client))
    registry.register(CustomMetricsCollector())

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", metrics)])
