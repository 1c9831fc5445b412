"""Numbers: latency percentiles, medians with min-max over repetitions, ratios to a baseline.

Pure functions over plain floats so the maths is unit-tested apart from any I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; NaN when there are none.

    Nearest rank, not interpolation, so p99 is a latency some request really saw, as wrk
    and HdrHistogram report it.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, not {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def latency_summary(latencies_us: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean in microseconds, the fields every generator reports."""
    if not latencies_us:
        return {k: math.nan for k in ("p50", "p90", "p99", "max", "mean")}
    return {
        "p50": percentile(latencies_us, 50),
        "p90": percentile(latencies_us, 90),
        "p99": percentile(latencies_us, 99),
        "max": float(max(latencies_us)),
        "mean": statistics.fmean(latencies_us),
    }


@dataclass(frozen=True)
class Spread:
    """The median of repeated measurements with their min and max."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        finite = [v for v in values if not math.isnan(v)]
        if not finite:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(finite), min(finite), max(finite), len(finite))


def paired_ratio(values: Sequence[float], baseline: Sequence[float]) -> float:
    """The median of ``values[i] / baseline[i]``: each repetition against the baseline's
    repetition measured next to it (the runner alternates the servers, A B A B), so a host
    whose speed drifts during a run moves both sides of each ratio alike, where the ratio
    of the two medians can pair a fast minute with a slow one. NaN unless both have the
    same number of repetitions, each with a figure."""
    if not values or len(values) != len(baseline):
        return math.nan
    ratios = [ratio(v, b) for v, b in zip(values, baseline, strict=True)]
    if any(math.isnan(r) for r in ratios):
        return math.nan
    return statistics.median(ratios)


def ratio(value: float, baseline: float) -> float:
    """``value / baseline``; NaN when either is missing or the baseline is zero."""
    if math.isnan(value) or math.isnan(baseline) or baseline == 0:
        return math.nan
    return value / baseline
