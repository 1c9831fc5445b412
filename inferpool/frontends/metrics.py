"""Prometheus metrics, read from the engine's statistics at scrape time.

The per-model collector lives here: ``EngineCollector`` turns what the engine keeps anyway
(``ModelStats``: counters and histograms recorded where a request is answered; the model
table; the pool's routes) into metric families when scraped; nothing here runs per
request. The two gauges an autoscaler reads (docs/deploy/autoscaling.md) come from the same
place: ``inferpool_model_in_flight_requests`` (accepted by the engine, not yet answered)
and ``inferpool_model_queued_requests`` (those of them that no worker runs yet: waiting for
a replica, in a worker's queue or its batcher; with ``--workers 0``, for a predict
thread or a batch). docs/operate/metrics.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

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
from inferpool.engine.pool.pool import PoolClient
from inferpool.engine.states import ModelState, ModelStatus
from inferpool.engine.stats import PROTOCOLS, REASONS, Histogram
from inferpool.errors import HTTP_OF_GRPC, grpc_code_for
from inferpool.frontends.metrics_server import ServerCollector

_NS = 1e-9
# The stages of ``StageTimes``, in ``ModelStats.stages``'s order, as /metrics names them.
_STAGES = ("queue", "decode", "predict", "encode")
_REPLICA_STATES = tuple(state.value.lower() for state in ModelState)


class EngineCollector(Collector):
    """Per-model requests, failures, latency, stage and batch histograms, replicas, load
    time, the load gauges, and readiness."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        buckets = client.buckets
        self._latency_le = [*map(floatToGoString, buckets.latency), "+Inf"]
        self._rows_le = [*map(floatToGoString, buckets.rows), "+Inf"]

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "version"]
        requests = CounterMetricFamily(
            "inferpool_model_requests",
            "Inference requests by protocol and outcome (HTTP status; gRPC's mapped to one)",
            labels=[*labels, "protocol", "code"],
        )
        failures = CounterMetricFamily(
            "inferpool_model_failures",
            "Inference requests that failed, by reason class",
            labels=[*labels, "reason"],
        )
        duration = HistogramMetricFamily(
            "inferpool_model_request_duration_seconds",
            "Time from the engine accepting a request to its reply, successful requests",
            labels=[*labels, "protocol"],
        )
        stages = HistogramMetricFamily(
            "inferpool_model_stage_duration_seconds",
            "Time per stage of successful requests: queue, decode, predict, encode",
            labels=[*labels, "stage"],
        )
        batch = HistogramMetricFamily(
            "inferpool_model_batch_size_rows",
            "Rows per model execution (one predict, batched requests together)",
            labels=labels,
        )
        replicas = GaugeMetricFamily(
            "inferpool_model_replicas",
            "Replicas of the model version by state",
            labels=[*labels, "state"],
        )
        load = GaugeMetricFamily(
            "inferpool_model_load_duration_seconds",
            "Seconds the version's last load took (failed or not)",
            labels=labels,
        )
        ready = GaugeMetricFamily(
            "inferpool_model_ready", "1 when the model is READY", labels=labels
        )
        in_flight = GaugeMetricFamily(
            "inferpool_model_in_flight_requests",
            "Requests accepted by the engine and not yet answered, queued ones included",
            labels=labels,
        )
        queued = GaugeMetricFamily(
            "inferpool_model_queued_requests",
            "In-flight requests not yet picked by a worker (waiting for a replica or queued)",
            labels=labels,
        )
        endpoint_calls = CounterMetricFamily(
            "inferpool_model_endpoint_requests",
            "Custom endpoint calls by protocol, registered path, method and HTTP status",
            labels=[*labels, "protocol", "path", "method", "code"],
        )
        feedback = CounterMetricFamily(
            "inferpool_model_feedback", "Feedbacks the model took (2xx)", labels=labels
        )
        reward = GaugeMetricFamily(
            "inferpool_model_feedback_reward_sum",
            "Sum of the rewards of the feedbacks the model took",
            labels=labels,
        )
        client = self.client
        running = client.running_requests()
        for status in client.table.all():
            key = [status.name, status.version or ""]
            ready.add_metric(key, 1.0 if status.state is ModelState.READY else 0.0)
            for state, count in self._replicas(status).items():
                replicas.add_metric([*key, state], count)
            seconds = client.load_seconds.get(status.key)
            if seconds is not None:
                load.add_metric(key, seconds)
            stats = client.stats.get(status.key)
            if stats is None:
                continue
            # A cancelled request is out of in_flight while a worker may still run it.
            waiting = stats.in_flight - running.get(status.key, 0)
            in_flight.add_metric(key, stats.in_flight)
            queued.add_metric(key, max(0, waiting))
            for protocol, codes in zip(PROTOCOLS, stats.codes, strict=True):
                for code, count in _code_counts(protocol, codes).items():
                    requests.add_metric([*key, protocol, code], count)
            for reason in REASONS:
                failures.add_metric([*key, reason], stats.failures.get(reason, 0))
            for protocol, histogram in zip(PROTOCOLS, stats.durations, strict=True):
                self._add(duration, [*key, protocol], histogram, self._latency_le, _NS)
            for stage, histogram in zip(_STAGES, stats.stages, strict=True):
                self._add(stages, [*key, stage], histogram, self._latency_le, _NS)
            self._add(batch, key, stats.batch_rows, self._rows_le, 1)
            for (via, path, method, answered), count in stats.endpoint_codes.items():
                endpoint_calls.add_metric([*key, via, "/" + path, method, str(answered)], count)
            feedback.add_metric(key, stats.feedback_count)
            reward.add_metric(key, stats.feedback_reward)
        server_ready = GaugeMetricFamily(
            "inferpool_server_ready", "1 when the server is ready (strict readiness)"
        )
        server_ready.add_metric([], 1.0 if client.not_ready_reason() is None else 0.0)
        yield from (requests, failures, duration, stages, batch, replicas, load, ready)
        yield from (in_flight, queued, server_ready, endpoint_calls, feedback, reward)

    @staticmethod
    def _add(
        family: HistogramMetricFamily,
        labels: list[str],
        histogram: Histogram,
        bounds: Sequence[str],
        unit: float,
    ) -> None:
        buckets = list(zip(bounds, histogram.cumulative(), strict=True))
        family.add_metric(labels, buckets, histogram.total * unit)

    def _replicas(self, status: ModelStatus) -> dict[str, int]:
        """The version's replicas by state. In the pool, a version with a route counts its
        ready replicas and, as loading, the worker slots meant to hold one that do not
        (their worker is being replaced or is loading it again); a version without one
        (loading for the first time, failed, unloading) counts the replicas it asked for
        under its own state. In-process a version is one replica in its state."""
        counts = dict.fromkeys(_REPLICA_STATES, 0)
        client = self.client
        route = client.routes.get(status.key) if isinstance(client, PoolClient) else None
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
