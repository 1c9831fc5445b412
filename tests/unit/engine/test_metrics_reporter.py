"""The runtimes' custom metrics between the API and the frontend's sum: what a worker's
reporter (``engine/worker/metrics_reporter.py``) takes from the API's values
(``runtimes/metrics.py``) and when it sends them, and the frontend's collector reading a
``--workers 0`` process's own values (the whole path, with servers:
tests/e2e/test_metrics_custom.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from inferpool.engine.custom_metrics_sum import FRONTEND, CustomMetricsCollector
from inferpool.engine.ipc.metrics_report import Metrics
from inferpool.engine.worker.metrics_reporter import Reporter, take
from inferpool.runtimes.metrics import LOCAL, ModelMetrics


@pytest.fixture
def model() -> Iterator[ModelMetrics]:
    take()  # whatever other tests of this process left
    metrics = ModelMetrics("iris", "2")
    yield metrics
    metrics.close()
    take()


def test_the_report_carries_each_metric_with_its_definition_and_series(
    model: ModelMetrics,
) -> None:
    model.counter("rows_total", "Rows seen", labels=("kind",)).labels("a").inc(3)
    model.histogram("size", "Sizes", buckets=(1, 10)).observe(5)
    message = take()
    assert not LOCAL.dirty and message.ended == []
    (state,) = message.models
    assert (state.instance, state.model, state.version) == (model.instance, "iris", "2")
    rows, size = state.families
    assert (rows.name, rows.kind, rows.labels) == ("rows", "counter", ["kind"])
    assert [(s.labels, s.value) for s in rows.series] == [(["a"], 3.0)]
    assert (size.kind, size.bounds) == ("histogram", [1.0, 10.0])
    assert [(s.value, s.counts) for s in size.series] == [(5.0, [0, 1, 0])]


def test_an_unloaded_model_is_reported_once_with_its_values_at_unload(
    model: ModelMetrics,
) -> None:
    counter = model.counter("calls", "Calls")
    counter.inc(2)
    take()
    model.close()
    counter.inc(5)  # its runtime still holds it: not reported any more
    message = take()
    assert message.models == []
    (ended,) = message.ended
    assert [series.value for series in ended.families[0].series] == [2.0]
    assert take() == Metrics([], [])


def test_the_reporter_sends_at_most_once_per_interval_and_only_changes(
    model: ModelMetrics,
) -> None:
    sent: list[Metrics] = []
    reporter = Reporter(sent.append)
    gauge = model.gauge("queue", "Queued", aggregate="max")
    reporter.report()
    assert len(sent) == 1 and reporter.wait(0) is None  # sent: nothing left to report
    gauge.set(4)
    reporter.report()  # within the interval: held back
    assert len(sent) == 1
    wait = reporter.wait(0)
    assert wait is not None and wait > 0
    reporter.report(force=True)
    assert len(sent) == 2 and sent[1].models[0].families[0].series[0].value == 4.0
    assert reporter.wait(0) is None  # nothing changed since
    reporter.report(force=True)
    assert len(sent) == 2


def test_the_collector_reads_this_process_models_with_workers_0(model: ModelMetrics) -> None:
    model.counter("answers", "Answers").inc(7)
    try:
        families = {family.name: family for family in CustomMetricsCollector().collect()}
    finally:
        FRONTEND.workers.pop(os.getpid(), None)  # this process counted as a worker
    (sample,) = families["answers"].samples
    assert sample.labels == {"model": "iris", "version": "2"} and sample.value == 7.0
    assert not LOCAL.dirty
