"""What a run leaves to read: the terminal table within 100 columns, every figure in the
CSV, the chart's titles, units, legend and baseline, and the HTML page that embeds it."""

from __future__ import annotations

import base64
import csv
import io
import re

from rich.console import Console

from benchmarks import chart, report
from benchmarks.results import FAILED, NOT_APPLICABLE, Cell, Run, summarize_all
from benchmarks.scenarios import full_matrix
from tests.bench.test_results import measurement, sample_run

LONGEST_SCENARIO = max((s.name for s in full_matrix()), key=len)
LONG_SERVER = "inferpool-w12-grpcio-library-otel-base"


def wide_run() -> Run:
    """Every column at its widest: the longest scenario of the full profile, a long
    server name, six-figure rates, errors, and cells without numbers."""
    servers = ["mlserver-w0", "inferpool-w2", LONG_SERVER]
    cells = []
    for scenario in (LONGEST_SCENARIO, "iris/b1/rest-json/c64"):
        for i, server in enumerate(servers):
            runs = [measurement(250_000 * (i + 1), errors=12_345 * i, p99_us=12_345_678.0)]
            cells.append(Cell(scenario, server, generator="builtin", measurements=runs))
    cells.append(Cell("iris/b1/rest-binary/c64", "mlserver-w0", NOT_APPLICABLE, "lacks it " * 9))
    cells.append(Cell("iris/b1/rest-binary/c64", LONG_SERVER, FAILED, "check: HTTP 500 " * 9))
    settings = {"baseline": "mlserver-w0", "started": "now", "repetitions": 1, "duration": 2.0}
    return Run({**settings, "servers": servers}, cells)


def rendered(run: Run, width: int = report.TABLE_WIDTH) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(report.rich_table(run))
    return console.file.getvalue()


def test_the_terminal_table_fits_100_columns_with_the_widest_cells() -> None:
    text = rendered(wide_run())
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    # Nothing is cut: every name and figure is there, a long one folded within its column
    # (its rest on the next line, below itself).
    for name in (LONGEST_SCENARIO, LONG_SERVER, "mlserver-w0", "iris/b1/rest-json/c64"):
        assert re.search(r"(?:[^\n]*\n *)?".join(map(re.escape, name)), text), name
    for figure in ("375,000", "3.00x", "12,346", "24,690", "n/a", "failed"):
        assert figure in text


def test_the_usual_names_are_not_folded() -> None:
    """The quick profile's names and inferpool-wN-grpcio fit on one line each."""
    base, fast = sample_run().cells[:2]
    for cell, server in zip((base, fast), ("mlserver-w0", "inferpool-w2-grpcio"), strict=True):
        cell.scenario, cell.server = "lightgbm/b256/rest-json17/c64", server
    run = Run({**sample_run().settings, "baseline": "mlserver-w0"}, [base, fast])
    lines = rendered(run).splitlines()
    assert any(
        "lightgbm/b256/rest-json17/c64" in line and "inferpool-w2-grpcio" in line for line in lines
    )


def test_cells_without_numbers_are_explained_below_the_table() -> None:
    notes = report.notes(sample_run())
    assert notes == [
        "s2 on base: n/a: mlserver-w0 lacks rest-binary",
        "s2 on fast: failed: check: HTTP 500",
    ]


def test_the_csv_holds_every_figure_the_terminal_leaves_out(tmp_path) -> None:
    run = sample_run()
    report.write_csv(run, tmp_path / "results.csv")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "results.csv").read_text())))
    assert [(r["scenario"], r["server"], r["status"]) for r in rows] == [
        ("s1", "base", "ok"),
        ("s1", "fast", "ok"),
        ("s2", "base", "n/a"),
        ("s2", "fast", "failed"),
    ]
    fast = rows[1]
    summary = summarize_all(run.cells, "base")[1]
    assert float(fast["rps_low"]) == summary.rps.low == 250.0
    assert (fast["errors"], fast["requests"]) == ("3", "2203")
    assert float(fast["rps_paired_ratio"]) == summary.rps_paired_ratio
    assert float(fast["p99_ms_high"]) == summary.p99_ms.high
    assert float(fast["server_cpu_pct"]) == 50.0 and float(fast["generator_cpu_pct"]) == 10.0
    assert float(fast["peak_rss_mib"]) == 100.0
    assert float(fast["stage_predict_us"]) == 3.0
    assert fast["reason"] == "" and rows[3]["reason"] == "check: HTTP 500"
    assert rows[2]["rps_median"] == "" and rows[0]["stage_queue_us"] == ""  # NaN: empty
    for header in ("paired", "srv CPU%", "gen CPU%", "peak RSS MiB", "q/dec/pred/enc µs"):
        assert header not in report.TERMINAL_HEADERS  # hence the CSV


def test_the_chart_has_titles_units_a_legend_and_the_baseline_first() -> None:
    import matplotlib.pyplot as plt

    run = wide_run()
    fig = chart.figure(run.summaries(), baseline="mlserver-w0")
    try:
        throughput, latency = fig.axes
        assert "Throughput" in fig.get_suptitle() and "mlserver-w0" in fig.get_suptitle()
        assert throughput.get_title() == "Throughput (higher is better)"
        assert latency.get_title() == "p99 latency (lower is better)"
        assert throughput.get_xlabel() == "requests per second"
        assert latency.get_xlabel() == "p99 latency (ms)"
        legend = [text.get_text() for text in fig.legends[0].get_texts()]
        assert legend == ["mlserver-w0 (baseline)", "inferpool-w2", LONG_SERVER]
        ticks = [tick.get_text() for tick in throughput.get_yticklabels()]
        assert ticks == [LONGEST_SCENARIO, "iris/b1/rest-json/c64", "iris/b1/rest-binary/c64"]
        labels = [text.get_text() for text in throughput.texts]
        assert "125,000" in labels and "250,000 (2.00x)" in labels  # baseline: no ratio
    finally:
        plt.close(fig)


def test_the_baseline_comes_first_whatever_the_order_of_servers() -> None:
    summaries = summarize_all(sample_run().cells, "fast")
    assert chart.ordered_servers(summaries, "fast") == ["fast", "base"]
    assert chart.ordered_servers(summaries, None) == ["base", "fast"]


def test_the_html_report_embeds_the_chart_and_names_each_scenario(tmp_path) -> None:
    run = wide_run()
    paths = report.write_files(run, tmp_path)
    assert set(paths) == {"json", "csv", "markdown", "png", "html"}
    page = (tmp_path / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    embedded = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert embedded is not None
    assert base64.b64decode(embedded[1]) == paths["png"].read_bytes()
    for scenario in {cell.scenario for cell in run.cells}:
        assert f"<td>{scenario}</td>" in page
    assert page.count("<tr") == 1 + len(run.cells)  # header + one row per cell
    assert "check: HTTP 500" in page  # why a cell has no numbers
    assert "<script" not in page and "http" not in page.replace("HTTP 500", "")  # self-contained


def test_rates_orders_of_magnitude_apart_are_drawn_on_a_log_scale_that_says_so() -> None:
    import matplotlib.pyplot as plt

    cells = [
        Cell("iris/b1/rest-json/c64", "x", generator="wrk", measurements=[measurement(40_000)]),
        Cell("forest/b256/grpc-raw/c8", "x", generator="h2load", measurements=[measurement(200)]),
    ]
    fig = chart.figure(summarize_all(cells, None))
    try:
        throughput = fig.axes[0]
        assert throughput.get_xscale() == "log"
        assert throughput.get_xlabel() == "requests per second, log scale"
        assert throughput.get_xlim()[1] >= 3 * 20_000  # room for the label past the bar
    finally:
        plt.close(fig)
