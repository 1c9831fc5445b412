"""The frontend's side of the runtimes' custom metrics (``runtimes/metrics.py``, sent by
the workers' ``engine/worker/metrics_reporter.py``).

``FRONTEND`` keeps the latest values each worker reported; what a worker reported before
it died or unloaded the model is kept (``retired``), so that a counter never goes down.
``CustomMetricsCollector`` sums it all at scrape time, with the labels ``model``,
``version`` and the runtime's own: counters and histograms are summed across workers
(bucket by bucket), gauges too unless defined with ``aggregate="max"`` (the largest) or
``"last"`` (the value set last, by the system's monotonic clock). With ``--workers 0`` the
models run in the server's process: its own values are read as one more worker's.
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from inferpool.engine.ipc.metrics_report import (
    MetricFamily,
    Metrics,
    MetricSeries,
    ModelMetricsState,
)
from inferpool.runtimes.metrics import LOCAL

logger = logging.getLogger(__name__)


class _Total:
    __slots__ = ("at", "counts", "value")

    def __init__(self, series: MetricSeries) -> None:
        self.value, self.counts, self.at = series.value, list(series.counts), series.at


class _Family:
    """A metric summed over models and workers: its definition and a total per series
    (gauges: summed, or the max, or the value set last, as the definition asks)."""

    def __init__(self, family: MetricFamily) -> None:
        self.kind = family.kind
        self.description = family.description
        self.labels = family.labels
        self.aggregate = family.aggregate
        self.bounds = family.bounds
        self.series: dict[tuple[str, ...], _Total] = {}

    def same(self, family: MetricFamily) -> bool:
        mine = (self.kind, self.labels, self.aggregate, self.bounds)
        return mine == (family.kind, family.labels, family.aggregate, family.bounds)

    def add(self, key: tuple[str, ...], series: MetricSeries) -> None:
        total = self.series.get(key)
        if total is None:
            self.series[key] = _Total(series)
            return
        if self.aggregate == "max":
            total.value = max(total.value, series.value)
        elif self.aggregate == "last":
            if series.at >= total.at:
                total.value, total.at = series.value, series.at
        else:
            total.value += series.value
        for index, count in enumerate(series.counts):
            total.counts[index] += count

    def export(self, name: str) -> Metric:
        labels = ["model", "version", *self.labels]
        if self.kind == "counter":
            family: Any = CounterMetricFamily(name, self.description, labels=labels)
        elif self.kind == "gauge":
            family = GaugeMetricFamily(name, self.description, labels=labels)
        else:
            family = HistogramMetricFamily(name, self.description, labels=labels)
        bounds = [*(repr(bound) for bound in self.bounds), "+Inf"]
        for key, total in self.series.items():
            if self.kind != "histogram":
                family.add_metric(list(key), total.value)
                continue
            buckets = list(zip(bounds, itertools.accumulate(total.counts), strict=True))
            family.add_metric(list(key), buckets, total.value)
        exported: Metric = family
        return exported


class Totals:
    """Metric families summed from models' states, by name."""

    def __init__(self) -> None:
        self.families: dict[str, _Family] = {}

    def add(self, state: ModelMetricsState, gauges: bool = True) -> None:
        for family in state.families:
            if family.kind == "gauge" and not gauges:
                continue
            total = self.families.get(family.name)
            if total is None:
                total = self.families[family.name] = _Family(family)
            elif not total.same(family):
                _conflict(family.name, state.model)
                continue
            for series in family.series:
                total.add((state.model, state.version, *series.labels), series)

    def export(self) -> Iterator[Metric]:
        for name, family in self.families.items():
            yield family.export(name)


_CONFLICTS: set[str] = set()


def _conflict(name: str, model: str) -> None:
    if name not in _CONFLICTS:  # said once per name
        _CONFLICTS.add(name)
        logger.warning(
            "custom metric %r of model %r is defined differently elsewhere (by another "
            "model, or an earlier load of this one): only the first definition seen is "
            "exported", name, model,
        )  # fmt: skip


class Aggregate:
    """The frontend's view: the latest values each worker reported (by its pid), and the
    counters and histograms of what ended (models unloaded, workers gone) in ``retired``."""

    def __init__(self) -> None:
        self.workers: dict[int, dict[int, ModelMetricsState]] = {}
        self.retired = Totals()

    def update(self, worker: int, message: Metrics) -> None:
        """A worker's report: its models' values now, and the last of those it unloaded."""
        current = {state.instance: state for state in message.models}
        ended = {state.instance for state in message.ended}
        for instance, state in self.workers.get(worker, {}).items():
            if instance not in current and instance not in ended:
                self.retired.add(state, gauges=False)
        for state in message.ended:
            self.retired.add(state, gauges=False)
        self.workers[worker] = current

    def worker_gone(self, worker: int) -> None:
        """Its counters and histograms keep what it reported; its gauges go."""
        for state in self.workers.pop(worker, {}).values():
            self.retired.add(state, gauges=False)

    def totals(self) -> Totals:
        totals = copy.deepcopy(self.retired)
        for models in self.workers.values():
            for state in models.values():
                totals.add(state)
        return totals


FRONTEND = Aggregate()


class CustomMetricsCollector(Collector):
    """The runtimes' own metrics, summed over workers, at scrape time."""

    def collect(self) -> Iterator[Metric]:
        if LOCAL.dirty:  # models run in this process (--workers 0)
            # Imported here: only a process that runs models loads the worker's modules.
            from inferpool.engine.worker.metrics_reporter import take

            FRONTEND.update(os.getpid(), take())
        yield from FRONTEND.totals().export()
