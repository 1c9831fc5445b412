"""A worker's report of its runtimes' custom metrics (``Op.METRICS``): each model's
families and series, as the worker's reporter (``engine/worker/metrics_reporter.py``)
sends them and the frontend sums them across workers (``engine/custom_metrics_sum.py``).
"""

from __future__ import annotations

import msgspec

from inferpool.engine.ipc.ops import Control, Op


class MetricSeries(msgspec.Struct, frozen=True, array_like=True):
    """One series of a custom metric: its label values and cumulative values."""

    labels: list[str]
    value: float  # a counter's or gauge's value; a histogram's sum
    counts: list[int] = []  # a histogram's observations per bucket (+Inf last)
    at: int = 0  # a gauge with aggregate="last": when it was set (monotonic ns)


class MetricFamily(msgspec.Struct, frozen=True, array_like=True):
    """A custom metric of one model, as its runtime defined it, with its series."""

    name: str
    kind: str  # counter | gauge | histogram
    description: str
    labels: list[str]
    series: list[MetricSeries]
    aggregate: str = "sum"  # a gauge across workers: sum | max | last
    bounds: list[float] = []  # a histogram's bucket bounds (+Inf implied)


class ModelMetricsState(msgspec.Struct, frozen=True, array_like=True):
    """The custom metrics of one loaded model in one process (``instance``: its key there)."""

    instance: int
    model: str
    version: str
    families: list[MetricFamily]


class Metrics(Control, frozen=True):
    """A worker's custom metrics: every model it holds, and the last values of those it
    unloaded since its previous report."""

    op = Op.METRICS
    models: list[ModelMetricsState]
    ended: list[ModelMetricsState] = []
