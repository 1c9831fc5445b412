"""The worker's side of the runtimes' custom metrics (``runtimes/metrics.py``): it ships
their values to the frontend, which sums them (``engine/custom_metrics_sum.py``).

A ``Reporter`` sends the cumulative values of every model the worker holds in one
``Op.METRICS`` message when something changed, at most once per ``REPORT_INTERVAL_NS``:
never one message per observation, and a late message loses nothing but time. ``take``
turns the values of ``runtimes.metrics.LOCAL`` into that message (the frontend's collector
does the same with ``--workers 0``, where the models run in its own process).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from inferpool.engine.ipc.metrics_report import (
    MetricFamily,
    Metrics,
    MetricSeries,
    ModelMetricsState,
)
from inferpool.runtimes.metrics import LOCAL, Metric, ModelMetrics

REPORT_INTERVAL_NS = 1_000_000_000  # a worker reports at most once a second


def state(model: ModelMetrics) -> ModelMetricsState:
    """A model's metrics and their values as the message carries them."""
    families = [_family(metric) for metric in model.metrics.values()]
    return ModelMetricsState(model.instance, model.model, model.version, families)


def _family(metric: Metric) -> MetricFamily:
    series = [
        MetricSeries(list(key), child.value, list(child.counts), child.at)
        for key, child in metric.series.items()
    ]
    return MetricFamily(
        metric.name, metric.kind, metric.description, list(metric.labelnames), series,
        metric.aggregate, list(metric.bounds),
    )  # fmt: skip


def take() -> Metrics:
    """Every model's values, and the last values of those unloaded since the last time."""
    models, ended = LOCAL.take(state)
    return Metrics(models, ended)


class Reporter:
    """When a worker sends ``LOCAL``'s values: at once after a quiet interval, then at most
    once per ``REPORT_INTERVAL_NS`` while they keep changing; never when nothing changed."""

    def __init__(self, send: Callable[[Metrics], None]) -> None:
        self._send = send
        self._next = 0

    def wait(self, now: int) -> float | None:
        """Seconds until a report is due, None when there is nothing to report."""
        return max(0.0, (self._next - now) / 1e9) if LOCAL.dirty else None

    def report(self, force: bool = False) -> None:
        """Send them if something changed and the interval has passed (or ``force``)."""
        if not LOCAL.dirty:
            return
        now = time.monotonic_ns()
        if force or now >= self._next:
            self._send(take())
            self._next = now + REPORT_INTERVAL_NS
