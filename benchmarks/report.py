"""Rendering a run: the terminal table (rich), the Markdown table for RESULTS.md, and the
files of a run folder (JSON, Markdown, PNG). Both tables share one row builder.
"""

from __future__ import annotations

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

_ERRORS = HEADERS.index("errors")


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


def rich_table(run: Run) -> Table:
    from rich.table import Table  # imported when drawn: the tests and `list` need no rich

    table = Table(title=f"baseline: {run.settings.get('baseline') or 'none'}", show_lines=False)
    for header in HEADERS:
        table.add_column(header, overflow="fold", no_wrap=header in ("scenario", "server"))
    summaries = run.summaries()
    for i, s in enumerate(summaries):
        cells = row(s)
        if s.status == OK and s.errors:
            cells[_ERRORS] = f"[bold red]{cells[_ERRORS]}[/]"
        elif s.status != OK:
            cells[3] = f"[yellow]{cells[3]}[/]"
        last_of_scenario = i + 1 < len(summaries) and summaries[i + 1].scenario != s.scenario
        table.add_row(*cells, end_section=last_of_scenario)
    return table


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
    return (
        f"Run {settings['started']}: {settings['repetitions']} x {settings['duration']} s per "
        f"cell{interleaved}, servers {', '.join(settings['servers'])}, baseline "
        f"{settings['baseline']}; idle RSS {', '.join(idle) or 'n/a'}; commit "
        f"{settings.get('commit') or 'n/a'}; load average "
        f"{load(settings.get('load_average_start'))} at the start, "
        f"{load(settings.get('load_average_end'))} at the end (2 cores)."
    )


def markdown(run: Run) -> str:
    """A GitHub Markdown table, the form RESULTS.md keeps."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += [
        "| " + " | ".join(c.replace("|", "\\|") for c in row(s)) + " |" for s in run.summaries()
    ]
    return "\n".join(lines) + "\n"


def write_files(run: Run, out: Path) -> dict[str, Path]:
    """results.json, results.md and results.png in ``out``."""
    from benchmarks.chart import chart

    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / "results.json",
        "markdown": out / "results.md",
        "png": out / "results.png",
    }
    run.write_json(paths["json"])
    paths["markdown"].write_text(context(run) + "\n\n" + markdown(run))
    chart(run.summaries(), paths["png"])
    return paths
