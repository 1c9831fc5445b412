"""Percentiles, medians with min-max, and ratios."""

import math

import pytest

from benchmarks.stats import Spread, latency_summary, percentile, ratio


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1
    assert percentile([5, 1, 3], 50) == 3  # unsorted input
    assert percentile([7], 99) == 7


def test_percentile_edges():
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_latency_summary():
    summary = latency_summary([10, 20, 30, 40])
    assert summary == {"p50": 20, "p90": 40, "p99": 40, "max": 40, "mean": 25}
    assert all(math.isnan(v) for v in latency_summary([]).values())


def test_spread_median_min_max_ignores_missing_runs():
    spread = Spread.of([3.0, 1.0, math.nan, 2.0, 10.0])
    assert (spread.median, spread.low, spread.high, spread.n) == (2.5, 1.0, 10.0, 4)
    assert Spread.of([4.0]).median == 4.0
    assert Spread.of([]).n == 0 and math.isnan(Spread.of([]).median)


def test_ratio():
    assert ratio(300.0, 100.0) == 3.0
    assert math.isnan(ratio(1.0, 0.0))
    assert math.isnan(ratio(math.nan, 1.0))
    assert math.isnan(ratio(1.0, math.nan))
