"""Metrics a runtime defines itself (``self.metrics.counter(...)``): the API a runtime
calls, in the process that runs the model (a worker, or the server with ``--workers 0``).

``ModelMetrics`` is a runtime's ``self.metrics``: it defines counters, gauges and
histograms, checked when defined (a name of inferpool's or not Prometheus's, a reserved
label, another type under the same name: ``ModelLoadError``, so a load fails saying why),
whose values accumulate in this process (``LOCAL``). Nothing here knows how they leave
it: the worker's reporter (``engine/worker/metrics_reporter.py``) takes them from ``LOCAL``
when ``LOCAL.dirty`` says something changed, turned into its own messages by the function
it hands to ``LOCAL.take``; the frontend sums them (``engine/custom_metrics_sum.py``).
"""

from __future__ import annotations

import bisect
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NoReturn, TypeVar

from inferpool.errors import ModelLoadError

MAX_SERIES = 1000  # label combinations per metric: a request id as a label is a bug
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
AGGREGATES = ("sum", "max", "last")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED_PREFIX = "inferpool_"
_RESERVED_LABELS = frozenset({"model", "version"})

# One lock for every value of this process: a runtime may update from its own threads,
# and a report reads them all at once.
_LOCK = threading.Lock()


class _Series:
    """One series of a metric (one combination of its label values) and its values."""

    __slots__ = ("at", "counts", "metric", "value")

    def __init__(self, metric: Metric) -> None:
        self.metric = metric
        self.value = 0.0  # a histogram's sum
        self.counts = [0] * (len(metric.bounds) + 1) if metric.bounds else []  # per bucket
        self.at = 0  # when a gauge was last set (monotonic ns, for aggregate="last")


class CounterSeries(_Series):
    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        amount = float(amount)  # a numpy scalar too: the report carries plain floats
        if not amount >= 0:
            raise ValueError(f"counter '{self.metric.name}' only goes up: inc({amount!r})")
        with _LOCK:
            self.value += amount
            LOCAL.dirty = True


class GaugeSeries(_Series):
    __slots__ = ()

    def set(self, value: float) -> None:
        self._change(float(value), 0.0)

    def inc(self, amount: float = 1.0) -> None:
        self._change(None, float(amount))

    def dec(self, amount: float = 1.0) -> None:
        self._change(None, -float(amount))

    def _change(self, value: float | None, add: float) -> None:
        with _LOCK:
            self.value = self.value + add if value is None else value
            if self.metric.aggregate == "last":
                self.at = time.monotonic_ns()
            LOCAL.dirty = True


class HistogramSeries(_Series):
    __slots__ = ()

    def observe(self, value: float) -> None:
        value = float(value)
        index = bisect.bisect_left(self.metric.bounds, value)  # the first bound >= value
        with _LOCK:
            self.counts[index] += 1
            self.value += value
            LOCAL.dirty = True


class Metric:
    """What counters, gauges and histograms share: a name, labels and their series."""

    kind: ClassVar[str]
    series_class: ClassVar[type[_Series]]

    def __init__(
        self,
        owner: str,
        name: str,
        description: str,
        labels: tuple[str, ...],
        aggregate: str,
        bounds: tuple[float, ...],
    ) -> None:
        self.owner = owner  # the model's name
        self.name = name
        self.description = description
        self.labelnames = labels
        self.aggregate = aggregate
        self.bounds = bounds
        # Its series by label values (the reporter reads them, under the lock, in ``take``).
        self.series: dict[tuple[str, ...], Any] = {}

    def definition(self) -> tuple[str, tuple[str, ...], str, tuple[float, ...]]:
        return self.kind, self.labelnames, self.aggregate, self.bounds

    def describe(self) -> str:
        text = f"a {self.kind} with the labels {list(self.labelnames)}"
        if self.kind == "gauge":
            return f"{text}, aggregate={self.aggregate!r}"
        return f"{text}, buckets {list(self.bounds)}" if self.bounds else text

    def labels(self, *values: object, **named: object) -> Any:
        """The series of these label values (positional, or by name), as prometheus_client."""
        if named and not values and set(named) == set(self.labelnames):
            values = tuple(named[label] for label in self.labelnames)
        elif named or not values or len(values) != len(self.labelnames):
            raise ValueError(f"metric '{self.name}' takes the labels {list(self.labelnames)}")
        return self._get(tuple(str(value) for value in values))

    def _get(self, key: tuple[str, ...]) -> Any:
        series = self.series.get(key)
        if series is None:
            if len(self.series) >= MAX_SERIES:
                raise ValueError(f"metric '{self.name}' has {MAX_SERIES} label combinations")
            with _LOCK:  # a report may be reading them (another thread, --workers 0)
                series = self.series[key] = self.series_class(self)
        return series

    def _unlabelled(self) -> Any:
        if self.labelnames:
            raise ValueError(f"metric '{self.name}' has labels: use .labels(...) first")
        return self._get(())

    def _frozen(self) -> Metric:
        """A copy of it and its values as they are now."""
        twin = type(self)(
            self.owner, self.name, self.description, self.labelnames, self.aggregate, self.bounds
        )
        for key, series in self.series.items():
            copy = twin.series[key] = twin.series_class(twin)
            copy.value, copy.counts, copy.at = series.value, list(series.counts), series.at
        return twin


class Counter(Metric):
    """A count that only goes up: ``inc(amount=1)``; exported as ``<name>_total``."""

    kind = "counter"
    series_class = CounterSeries

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)


class Gauge(Metric):
    """A value that goes up and down: ``set(value)``, ``inc(amount=1)``, ``dec(amount=1)``."""

    kind = "gauge"
    series_class = GaugeSeries

    def set(self, value: float) -> None:
        self._unlabelled().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._unlabelled().dec(amount)


class Histogram(Metric):
    """Observations counted in buckets: ``observe(value)``."""

    kind = "histogram"
    series_class = HistogramSeries

    def observe(self, value: float) -> None:
        self._unlabelled().observe(value)


_M = TypeVar("_M", bound=Metric)
_S = TypeVar("_S")  # a model's values as the reporter sends them


class ModelMetrics:
    """A runtime's ``self.metrics``: define the model's own metrics (in ``load`` or
    ``predict``). Defining a name again with the same definition returns the same metric."""

    def __init__(self, model: str, version: str | None) -> None:
        self.model = model
        self.version = version or ""
        self.metrics: dict[str, Metric] = {}
        self.instance = 0  # its key in LOCAL once it defines a metric

    def counter(self, name: str, description: str, labels: Sequence[str] = ()) -> Counter:
        """A counter, exported as ``<name>_total`` (a ``_total`` given here is dropped)."""
        if name.endswith("_total"):
            name = name[: -len("_total")]
        return self._define(Counter, name, description, labels, "sum", ())

    def gauge(
        self, name: str, description: str, labels: Sequence[str] = (), aggregate: str = "sum"
    ) -> Gauge:
        """A gauge; across workers its values are summed, or their ``max``, or the ``last``
        set."""
        if aggregate not in AGGREGATES:
            self._refuse(name, f"aggregate must be one of {', '.join(AGGREGATES)}")
        return self._define(Gauge, name, description, labels, aggregate, ())

    def histogram(
        self,
        name: str,
        description: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        """A histogram with these bucket upper bounds (``+Inf`` is added)."""
        bounds = tuple(float(bound) for bound in buckets)
        if bounds and bounds[-1] == math.inf:
            bounds = bounds[:-1]
        if not bounds or not all(map(math.isfinite, bounds)) or sorted(set(bounds)) != [*bounds]:
            self._refuse(name, f"buckets must be increasing finite numbers, got {list(buckets)}")
        return self._define(Histogram, name, description, labels, "sum", bounds)

    def close(self) -> None:
        """The model is unloaded: its last values are reported, then it is forgotten."""
        if self.instance:
            LOCAL.close(self)
            self.instance = 0

    def _define(
        self,
        kind: type[_M],
        name: str,
        description: str,
        labels: Sequence[str],
        aggregate: str,
        bounds: tuple[float, ...],
    ) -> _M:
        labelnames = (labels,) if isinstance(labels, str) else tuple(labels)
        self._check(name, labelnames, kind)
        # One name, one definition in a process: /metrics exports one family per name.
        definition = (kind.kind, labelnames, aggregate, bounds)
        existing = self.metrics.get(name)
        if existing is not None:
            if not isinstance(existing, kind) or existing.definition() != definition:
                self._refuse(name, "it is already defined with another type, labels or buckets")
            return existing
        other = LOCAL.defined(name)
        if other is not None and other.definition() != definition:
            self._refuse(name, f"model '{other.owner}' defines it as {other.describe()}")
        metric = kind(self.model, name, str(description), labelnames, aggregate, bounds)
        with _LOCK:
            self.metrics[name] = metric
            if not self.instance:
                LOCAL.add(self)
            LOCAL.dirty = True
        if not labelnames:
            metric._get(())  # exported as 0 from the start
        return metric

    def _check(self, name: str, labels: tuple[str, ...], kind: type[Metric]) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            self._refuse(name, "not a valid Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)")
        if name.startswith(_RESERVED_PREFIX):
            self._refuse(name, f"names starting with '{_RESERVED_PREFIX}' are inferpool's own")
        reserved = _RESERVED_LABELS | ({"le"} if kind is Histogram else set())
        for label in labels:
            if not isinstance(label, str) or not _LABEL.fullmatch(label) or label[:2] == "__":
                self._refuse(name, f"{label!r} is not a valid Prometheus label name")
            if label in reserved:
                self._refuse(name, f"the label {label!r} is reserved")
        if len(set(labels)) != len(labels):
            self._refuse(name, f"a label appears twice in {list(labels)}")

    def _refuse(self, name: object, reason: str) -> NoReturn:
        raise ModelLoadError(f"model '{self.model}': custom metric {name!r}: {reason}")

    def _frozen(self) -> ModelMetrics:
        """Its metrics and their values as they are now: what is reported of a model
        unloaded since the last report, whatever its runtime still does with them."""
        twin = ModelMetrics(self.model, self.version)
        twin.instance = self.instance
        twin.metrics = {name: metric._frozen() for name, metric in self.metrics.items()}
        return twin


class _Local:
    """The custom metrics of the models this process runs."""

    def __init__(self) -> None:
        self.models: dict[int, ModelMetrics] = {}
        self.ended: list[ModelMetrics] = []  # unloaded since the last report (frozen)
        self.dirty = False
        self._next_instance = 1

    def add(self, metrics: ModelMetrics) -> None:
        metrics.instance = self._next_instance
        self._next_instance += 1
        self.models[metrics.instance] = metrics

    def close(self, metrics: ModelMetrics) -> None:
        with _LOCK:
            if self.models.pop(metrics.instance, None) is not None:
                self.ended.append(metrics._frozen())
                self.dirty = True

    def defined(self, name: str) -> Metric | None:
        """The metric of that name another model of this process defined, if any."""
        for model in list(self.models.values()):
            metric = model.metrics.get(name)
            if metric is not None:
                return metric
        return None

    def take(self, state: Callable[[ModelMetrics], _S]) -> tuple[list[_S], list[_S]]:
        """Every model's values, and the last values of those unloaded since the last time,
        each as ``state`` turns it (the reporter's message)."""
        with _LOCK:
            models = [state(model) for model in self.models.values()]
            ended = [state(model) for model in self.ended]
            self.ended = []
            self.dirty = False
        return models, ended


LOCAL = _Local()
