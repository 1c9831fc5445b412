"""Prometheus metrics on their own port, read from the engine's statistics at scrape time.

Nothing is recorded per request for Prometheus: the collector turns the counters the
engine keeps anyway (ModelStats, the model table) into metric families when scraped.
The two gauges an autoscaler reads (docs/deploy/autoscaling.md) come from the same place:
``inferpool_model_in_flight_requests`` (accepted by the engine, not yet answered) and
``inferpool_model_queued_requests`` (those of them that no worker runs yet: waiting for a
replica, in a worker's queue or its batcher); with ``--workers 0`` nothing waits, so
queued is 0 by construction.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferpool.engine.client import EngineClient
from inferpool.engine.states import ModelState
from inferpool.engine.stats import STAGES

_NS = 1e-9


class EngineCollector(Collector):
    """Per-model request counts, latency and stage times, load gauges, and readiness."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "version"]
        success = CounterMetricFamily(
            "inferpool_model_infer_success", "Inference requests that succeeded", labels=labels
        )
        failure = CounterMetricFamily(
            "inferpool_model_infer_failure", "Inference requests that failed", labels=labels
        )
        duration = SummaryMetricFamily(
            "inferpool_model_infer_duration_seconds",
            "Time from dispatch to reply of successful requests",
            labels=labels,
        )
        stages = SummaryMetricFamily(
            "inferpool_model_stage_duration_seconds",
            "Time per stage: queue, compute_input (decode), compute_infer, compute_output",
            labels=[*labels, "stage"],
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
        running = self.client.running_requests()
        for status in self.client.table.all():
            key = [status.name, status.version or ""]
            ready.add_metric(key, 1.0 if status.state is ModelState.READY else 0.0)
            stats = self.client.stats.get(status.key)
            if stats is None:
                continue
            # A cancelled request is out of in_flight while a worker may still run it.
            waiting = stats.in_flight - running.get(status.key, 0)
            in_flight.add_metric(key, stats.in_flight)
            queued.add_metric(key, max(0, waiting))
            success.add_metric(key, stats.success)
            failure.add_metric(key, stats.fail)
            duration.add_metric(key, stats.success, stats.success_ns * _NS)
            for stage in STAGES:
                stages.add_metric([*key, stage], stats.stage_count, stats.stage_ns[stage] * _NS)
        server_ready = GaugeMetricFamily(
            "inferpool_server_ready", "1 when the server is ready (strict readiness)"
        )
        server_ready.add_metric([], 1.0 if self.client.not_ready_reason() is None else 0.0)
        yield from (success, failure, duration, stages, ready, in_flight, queued, server_ready)
        # The worker pool's supervision (absent with --workers 0).
        for attribute, help_text in (
            ("template_restarts", "Times the worker template process was restarted"),
            ("worker_restarts", "Times a worker process was replaced"),
        ):
            count = getattr(self.client, attribute, None)
            if count is not None:
                yield CounterMetricFamily(f"inferpool_{attribute}", help_text, value=count)


def build_metrics_app(client: EngineClient) -> Starlette:
    """``GET /metrics`` in Prometheus's text format."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(client))

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", metrics)])
