"""Summaries across repetitions, ratios against the baseline, and the report files."""

import json
import math

import pytest

from benchmarks import report
from benchmarks.loadgen.base import LoadResult
from benchmarks.results import FAILED, NOT_APPLICABLE, Cell, Measurement, Run, summarize_all
from benchmarks.stats import paired_ratio


def measurement(ok: int, errors: int = 0, p99_us: float = 2000.0, cpu: float = 1.0) -> Measurement:
    load = LoadResult(
        requests=ok + errors,
        errors=errors,
        duration=2.0,
        latency_us={"p50": 1000.0, "p99": p99_us},
        generator_cpu=0.2,
    )
    return Measurement(load, server_cpu=cpu, peak_rss=100 * 2**20, stages=None)


def sample_run() -> Run:
    base = Cell(
        "s1",
        "base",
        generator="wrk",
        measurements=[measurement(200), measurement(300), measurement(250)],
    )
    fast = Cell(
        "s1",
        "fast",
        generator="wrk",
        measurements=[
            measurement(900, p99_us=1000),
            measurement(500, errors=3, p99_us=500),
            measurement(800, p99_us=1500),
        ],
    )
    fast.measurements[0].stages = {"queue": 1.0, "decode": 2.0, "predict": 3.0, "encode": 4.0}
    na = Cell("s2", "base", status=NOT_APPLICABLE, reason="mlserver-w0 lacks rest-binary")
    broken = Cell("s2", "fast", status=FAILED, reason="check: HTTP 500")
    settings = {
        "baseline": "base",
        "started": "now",
        "repetitions": 3,
        "duration": 2.0,
        "servers": ["base", "fast"],
    }
    return Run(settings, [base, fast, na, broken])


def test_medians_min_max_and_ratio_to_baseline():
    base, fast, na, broken = summarize_all(sample_run().cells, "base")
    assert (base.rps.median, base.rps.low, base.rps.high) == (125.0, 100.0, 150.0)
    assert base.rps_ratio == 1.0
    # fast: ok counts 900, 500, 800 over 2 s -> medians 400 req/s and 1.0 ms p99
    assert fast.rps.median == 400.0 and fast.rps.low == 250.0
    assert fast.rps_ratio == 3.2
    assert fast.p99_ratio == 0.5
    assert fast.errors == 3 and fast.requests == 2203
    assert fast.server_cpu_pct == 50.0 and fast.generator_cpu_pct == 10.0
    assert fast.peak_rss_mib == 100.0
    assert fast.stages_us == {"queue": 1.0, "decode": 2.0, "predict": 3.0, "encode": 4.0}
    assert math.isnan(na.rps_ratio) and na.rps.n == 0
    assert math.isnan(broken.rps_ratio)


def test_paired_ratio_sets_each_repetition_against_the_baselines_next_to_it():
    # Req/s of a 2026-12-04 run (xgboost/b256/grpc-raw/c64, RESULTS.md): the host slowed by
    # a third for the last repetitions, and in the fourth pair for the new server only. The
    # medians set its slow minutes against the baseline's fast ones.
    base_rates = [3919, 3978, 3997, 3995, 2714, 2898]
    new_rates = [4037, 3862, 4318, 3098, 2679, 2871]
    base = Cell("s", "base", measurements=[measurement(2 * r) for r in base_rates])
    new = Cell("s", "new", measurements=[measurement(2 * r) for r in new_rates])
    _, summary = summarize_all([base, new], "base")
    assert summary.rps_ratio == pytest.approx(3480 / 3948.5)  # 0.88
    pairs = sorted(n / b for n, b in zip(new_rates, base_rates, strict=True))
    assert summary.rps_paired_ratio == pytest.approx((pairs[2] + pairs[3]) / 2)  # 0.99
    assert report.row(summary)[report.HEADERS.index("paired")] == "0.99x"


def test_paired_ratio_needs_the_same_repetitions_on_both_sides():
    assert math.isnan(paired_ratio([1.0, 2.0], [1.0]))
    assert math.isnan(paired_ratio([], []))
    assert math.isnan(paired_ratio([1.0], [0.0]))
    assert paired_ratio([3.0, 1.0, 2.0], [1.0, 1.0, 1.0]) == 2.0


def test_rows_say_why_a_cell_has_no_numbers():
    summaries = summarize_all(sample_run().cells, "base")
    fast_row = dict(zip(report.HEADERS, report.row(summaries[1]), strict=True))
    assert fast_row["req/s (min-max)"] == "400 (250-450)"
    assert fast_row["x base"] == "3.20x"
    assert fast_row["paired"] == "3.20x"  # repetitions 4.5x, 1.67x, 3.2x
    assert fast_row["errors"] == "3/2203"
    assert fast_row["q/dec/pred/enc µs"] == "1/2/3/4"
    assert report.row(summaries[0])[-1] == "n/a"
    assert report.row(summaries[2])[3] == "n/a: mlserver-w0 lacks rest-binary"
    assert report.row(summaries[3])[3] == "failed: check: HTTP 500"


def test_markdown_table_has_one_row_per_cell():
    lines = report.markdown(sample_run()).splitlines()
    assert lines[0].startswith("| scenario | server |")
    assert len(lines) == 2 + 4
    assert all(line.count("|") == len(report.HEADERS) + 1 for line in lines)


def test_files_are_written_and_json_has_no_nan(tmp_path):
    paths = report.write_files(sample_run(), tmp_path)
    document = json.loads(paths["json"].read_text())  # strict JSON: NaN would be invalid
    assert "NaN" not in paths["json"].read_text()
    assert document["summary"][2]["rps_ratio"] is None
    assert len(document["cells"][1]["measurements"]) == 3
    assert paths["markdown"].read_text().startswith("Run now: 3 x 2.0 s per cell")
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cpu_per_answered_request_for_the_tree_and_the_frontend():
    # 1.0 s of tree CPU and 0.25 s in the frontend over 500 answered requests (3 failed).
    runs = [measurement(500, errors=3, cpu=1.0) for _ in range(3)]
    for run in runs:
        run.frontend_cpu = 0.25
    (summary,) = summarize_all([Cell("s", "x", generator="wrk", measurements=runs)], None)
    assert summary.cpu_us_per_request == 2000.0
    assert summary.frontend_cpu_us_per_request == 500.0
    assert "2,000/500" in report.row(summary)
