"""Results of a run: raw measurements per (scenario, server) cell, their summary across
repetitions (median, min-max, ratio to the baseline) and the JSON file that holds both.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.loadgen.base import LoadResult
from benchmarks.stats import Spread, paired_ratio, ratio

# A cell's status: measured, not applicable (server lacks the protocol) or failed.
OK, NOT_APPLICABLE, FAILED = "ok", "n/a", "failed"


@dataclass
class Measurement:
    """One repetition of one cell."""

    load: LoadResult
    server_cpu: float  # CPU seconds of the whole server tree during the run
    peak_rss: float  # bytes, whole server tree; NaN when its pid is unknown
    stages: dict[str, float] | None = None  # mean µs per request, from the server's stats
    frontend_cpu: float = math.nan  # CPU seconds of the server's own process (no workers)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "load": self.load.to_dict()}


@dataclass
class Cell:
    """A scenario on a server: status, the generator used and every repetition."""

    scenario: str
    server: str
    status: str = OK
    reason: str = ""
    generator: str = ""
    measurements: list[Measurement] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "measurements": [m.to_dict() for m in self.measurements]}


@dataclass
class Summary:
    """A cell condensed over its repetitions (NaN where nothing was measured)."""

    scenario: str
    server: str
    status: str
    reason: str
    generator: str
    rps: Spread
    p50_ms: Spread
    p99_ms: Spread
    errors: int
    requests: int
    server_cpu_pct: float  # of one core, median over repetitions
    generator_cpu_pct: float
    cpu_us_per_request: float  # whole server tree, median over repetitions
    frontend_cpu_us_per_request: float  # the server's own process only
    peak_rss_mib: float
    stages_us: dict[str, float] | None
    rps_ratio: float = math.nan  # median req/s against the baseline's
    rps_paired_ratio: float = math.nan  # median of each repetition against the baseline's
    p99_ratio: float = math.nan


def _median(values: list[float]) -> float:
    return Spread.of(values).median


def _per_request(cpu_seconds: float, measurement: Measurement) -> float:
    """CPU µs per answered request (NaN when none was answered or CPU is unknown)."""
    answered = measurement.load.requests - measurement.load.errors
    return 1e6 * cpu_seconds / answered if answered > 0 else math.nan


def summarize(cell: Cell) -> Summary:
    runs = cell.measurements
    loads = [m.load for m in runs]
    stage_runs = [m.stages for m in runs if m.stages]
    stages = None
    if stage_runs:
        stages = {k: _median([s[k] for s in stage_runs]) for k in stage_runs[0]}
    return Summary(
        scenario=cell.scenario,
        server=cell.server,
        status=cell.status,
        reason=cell.reason,
        generator=cell.generator,
        rps=Spread.of(r.rps for r in loads),
        p50_ms=Spread.of(r.latency_us.get("p50", math.nan) / 1000 for r in loads),
        p99_ms=Spread.of(r.latency_us.get("p99", math.nan) / 1000 for r in loads),
        errors=sum(r.errors for r in loads),
        requests=sum(r.requests for r in loads),
        server_cpu_pct=_median([100 * m.server_cpu / m.load.duration for m in runs]),
        generator_cpu_pct=_median([100 * r.generator_cpu / r.duration for r in loads]),
        cpu_us_per_request=_median([_per_request(m.server_cpu, m) for m in runs]),
        frontend_cpu_us_per_request=_median([_per_request(m.frontend_cpu, m) for m in runs]),
        peak_rss_mib=Spread.of(m.peak_rss for m in runs).high / 2**20,
        stages_us=stages,
    )


def _rates(cell: Cell) -> list[float]:
    return [m.load.rps for m in cell.measurements]


def summarize_all(cells: list[Cell], baseline: str | None) -> list[Summary]:
    """Summaries in cell order, each with its ratio to the same scenario on ``baseline``."""
    summaries = [summarize(c) for c in cells]
    base = {s.scenario: s for s in summaries if s.server == baseline and s.status == OK}
    base_rates = {c.scenario: _rates(c) for c in cells if c.server == baseline}
    for cell, s in zip(cells, summaries, strict=True):
        if s.scenario in base and s.status == OK:
            s.rps_ratio = ratio(s.rps.median, base[s.scenario].rps.median)
            s.rps_paired_ratio = paired_ratio(_rates(cell), base_rates[s.scenario])
            s.p99_ratio = ratio(s.p99_ms.median, base[s.scenario].p99_ms.median)
    return summaries


@dataclass
class Run:
    """Everything one invocation measured, with the settings that produced it."""

    settings: dict[str, object]
    cells: list[Cell] = field(default_factory=list)
    servers: dict[str, dict[str, object]] = field(default_factory=dict)  # idle RSS, command

    def summaries(self) -> list[Summary]:
        return summarize_all(self.cells, self.settings.get("baseline"))

    def write_json(self, path: Path) -> None:
        document = {
            "settings": self.settings,
            "servers": self.servers,
            "summary": [_plain(asdict(s)) for s in self.summaries()],
            "cells": [_plain(c.to_dict()) for c in self.cells],
        }
        path.write_text(json.dumps(document, indent=2))


def _plain(value: object) -> object:
    """JSON has no NaN: write null instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
