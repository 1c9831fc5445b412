"""Rendering a run: the terminal table (rich, at most 100 columns), the Markdown table for
RESULTS.md, and the files of a run folder (JSON, CSV, Markdown, PNG, HTML). The Markdown
and HTML tables share one row builder; the terminal table keeps the columns one reads
first, the CSV and JSON every figure.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.results import OK, Run, Summary
from benchmarks.stats import Spread

if TYPE_CHECKING:
    from rich.table import Table

HEADERS = (
    "scenario",
    "server",
    "gen",
    "req/s (min-max)",
    "x base",
    "paired",
    "p50 ms",
    "p99 ms (min-max)",
    "errors",
    "srv CPU%",
    "gen CPU%",
    "CPU µs/req (all/front)",
    "peak RSS MiB",
    "q/dec/pred/enc µs",
)


def number(value: float, digits: int = 0) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def spread(value: Spread, digits: int = 0) -> str:
    if value.n == 0:
        return "n/a"
    if value.n == 1:
        return number(value.median, digits)
    low, high = number(value.low, digits), number(value.high, digits)
    return f"{number(value.median, digits)} ({low}-{high})"


def stages(split: dict[str, float] | None) -> str:
    if not split:
        return "n/a"
    return "/".join(number(split[k], 0) for k in ("queue", "decode", "predict", "encode"))


def times(ratio: float) -> str:
    return "" if math.isnan(ratio) else f"{ratio:.2f}x"


def row(s: Summary) -> list[str]:
    """One table row; a cell that was not measured says why instead of numbers."""
    head = [s.scenario, s.server, s.generator or "-"]
    if s.status != OK:
        return [*head, f"{s.status}: {s.reason}"[:120], *[""] * (len(HEADERS) - 4)]
    return [
        *head,
        spread(s.rps),
        times(s.rps_ratio),
        times(s.rps_paired_ratio),
        number(s.p50_ms.median, 2),
        spread(s.p99_ms, 2),
        f"{s.errors}/{s.requests}",
        number(s.server_cpu_pct),
        number(s.generator_cpu_pct),
        f"{number(s.cpu_us_per_request)}/{number(s.frontend_cpu_us_per_request)}",
        number(s.peak_rss_mib),
        stages(s.stages_us),
    ]


# The terminal's columns: what one reads first. Spreads, paired ratios, CPU shares, memory
# and the stage split are in results.csv, results.json, results.md and report.html.
TERMINAL_HEADERS = ("scenario", "server", "req/s", "x base", "p50 ms", "p99 ms", "errors", "µs/req")
# The widest the terminal table may be: it stays readable in a CI log and a split window.
TABLE_WIDTH = 100


def short_ms(value: float) -> str:
    """Milliseconds to three significant figures (0.512, 5.12, 51.2, 512, 5,120): at most
    five characters below 100 s."""
    if math.isnan(value):
        return "n/a"
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:,.{digits}f}"


def terminal_row(s: Summary) -> list[str]:
    """The terminal table's row; a cell without numbers says only ``n/a`` or ``failed``,
    its reason goes below the table (:func:`notes`)."""
    if s.status != OK:
        return [s.scenario, s.server, s.status, *[""] * (len(TERMINAL_HEADERS) - 3)]
    return [
        s.scenario,
        s.server,
        number(s.rps.median),
        times(s.rps_ratio),
        short_ms(s.p50_ms.median),
        short_ms(s.p99_ms.median),
        f"{s.errors:,}",  # of s.requests, both in the CSV
        number(s.cpu_us_per_request),
    ]


def rich_table(run: Run) -> Table:
    """The run's table for a terminal or a log, meant to be printed at most
    :data:`TABLE_WIDTH` columns wide (long names wrap within their column)."""
    from rich import box
    from rich.table import Table  # imported when drawn: the tests and `list` need no rich

    baseline = run.settings.get("baseline") or "none"
    # No edges and two spaces between columns: the names keep the room.
    table = Table(
        title=f"medians; x base: req/s against {baseline}",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    for header in TERMINAL_HEADERS:
        numeric = header not in ("scenario", "server")
        table.add_column(header, overflow="fold", justify="right" if numeric else "left")
    summaries = run.summaries()
    for i, s in enumerate(summaries):
        cells = terminal_row(s)
        if s.status == OK and s.errors:
            cells[6] = f"[bold red]{cells[6]}[/]"
        elif s.status != OK:
            cells[2] = f"[yellow]{cells[2]}[/]"
        last_of_scenario = i + 1 < len(summaries) and summaries[i + 1].scenario != s.scenario
        table.add_row(*cells, end_section=last_of_scenario)
    return table


def notes(run: Run) -> list[str]:
    """Why each cell without numbers has none, one line each."""
    return [
        f"{s.scenario} on {s.server}: {s.status}: {s.reason}"
        for s in run.summaries()
        if s.status != OK
    ]


def csv_fields(s: Summary) -> dict[str, object]:
    """A summary as flat columns: a spread gives ``_median``/``_low``/``_high``/``_n``, the
    stage split ``stage_<name>_us``; NaN becomes an empty cell."""
    flat: dict[str, object] = {}
    for field in dataclasses.fields(s):
        value = getattr(s, field.name)
        if isinstance(value, Spread):
            for part in ("median", "low", "high", "n"):
                flat[f"{field.name}_{part}"] = getattr(value, part)
        elif field.name == "stages_us":
            for stage in ("queue", "decode", "predict", "encode"):
                flat[f"stage_{stage}_us"] = (value or {}).get(stage, math.nan)
        else:
            flat[field.name] = value
    return {k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in flat.items()}


def write_csv(run: Run, path: Path) -> None:
    """Every summary's every figure, one row per (scenario, server)."""
    rows = [csv_fields(s) for s in run.summaries()]
    with path.open("w", newline="") as sink:
        if rows:
            writer = csv.DictWriter(sink, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def load(average: list[float] | tuple[float, ...] | None) -> str:
    """The 1-minute load average, the one that covers a measurement."""
    return "n/a" if not average else f"{average[0]:.1f}"


def context(run: Run) -> str:
    """What the table does not show: settings, idle memory, commit, how busy the machine was.

    Idle RSS is the whole server tree right after it became ready.
    """
    settings = run.settings
    idle = [f"{name} {number(info['idle_rss_mib'])} MiB" for name, info in run.servers.items()]
    interleaved = ", scenarios interleaved" if settings.get("interleave") else ""
    note = f" {settings['note']}" if settings.get("note") else ""
    return (
        f"Run {settings['started']}: {settings['repetitions']} x {settings['duration']} s per "
        f"cell{interleaved}, servers {', '.join(settings['servers'])}, baseline "
        f"{settings['baseline']}; idle RSS {', '.join(idle) or 'n/a'}; commit "
        f"{settings.get('commit') or 'n/a'}; load average "
        f"{load(settings.get('load_average_start'))} at the start, "
        f"{load(settings.get('load_average_end'))} at the end (2 cores).{note}"
    )


def markdown(run: Run) -> str:
    """A GitHub Markdown table, the form RESULTS.md keeps."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += [
        "| " + " | ".join(c.replace("|", "\\|") for c in row(s)) + " |" for s in run.summaries()
    ]
    return "\n".join(lines) + "\n"


def write_files(run: Run, out: Path) -> dict[str, Path]:
    """results.json, results.csv, results.md, results.png and report.html in ``out``."""
    from benchmarks import html_report
    from benchmarks.chart import chart

    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / "results.json",
        "csv": out / "results.csv",
        "markdown": out / "results.md",
        "png": out / "results.png",
        "html": out / "report.html",
    }
    run.write_json(paths["json"])
    write_csv(run, paths["csv"])
    paths["markdown"].write_text(context(run) + "\n\n" + markdown(run))
    baseline = run.settings.get("baseline")
    chart(run.summaries(), paths["png"], baseline if isinstance(baseline, str) else None)
    rows = [row(s) for s in run.summaries()]
    page = html_report.render(context(run), HEADERS, rows, paths["png"].read_bytes(), notes(run))
    paths["html"].write_text(page)
    return paths
