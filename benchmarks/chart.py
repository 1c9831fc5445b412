"""The PNG chart of a run: throughput and p99 latency per scenario, one bar per server with
min-max whiskers, the baseline (the peer, or the configuration compared against) drawn
first and in grey beside the others, each bar labelled with its figure.

Bars are horizontal, scenarios down the page: a full run (120 scenarios x 9 servers) grows
tall, which scrolls, instead of ten thousand pixels wide.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.results import OK, Summary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INCHES_PER_BAR = 0.22
BASELINE_COLOUR = "#9e9e9e"
# (metric, axis title, axis label with its unit, digits of the bar labels)
PANELS = (
    ("rps", "Throughput (higher is better)", "requests per second", 0),
    ("p99_ms", "p99 latency (lower is better)", "p99 latency (ms)", 1),
)


def ordered_servers(summaries: list[Summary], baseline: str | None) -> list[str]:
    """Servers in run order, the baseline first: the top bar of each scenario is the one
    the others are read against."""
    servers = list(dict.fromkeys(s.server for s in summaries))
    return sorted(servers, key=lambda name: name != baseline)


def bar_label(summary: Summary, metric: str, digits: int, baseline: str | None) -> str:
    """A bar's figure, with its ratio to the baseline on the throughput panel."""
    text = f"{getattr(summary, metric).median:,.{digits}f}"
    ratio = summary.rps_ratio
    if metric == "rps" and summary.server != baseline and ratio == ratio:  # not NaN
        text += f" ({ratio:.2f}x)"
    return text


def draw_panel(
    axis: Axes,
    panel: tuple[str, str, str, int],
    scenarios: list[str],
    servers: list[str],
    index: dict[tuple[str, str], Summary],
    baseline: str | None,
) -> None:
    """One metric's bars for every scenario and server."""
    import numpy as np

    metric, title, label, digits = panel
    height = 0.8 / max(1, len(servers))
    y = np.arange(len(scenarios))
    for i, server in enumerate(servers):
        cells = [index.get((sc, server)) for sc in scenarios]
        med = np.array([getattr(c, metric).median if c else np.nan for c in cells])
        low = [getattr(c, metric).low if c else np.nan for c in cells]
        high = [getattr(c, metric).high if c else np.nan for c in cells]
        whiskers = [np.nan_to_num(med - low), np.nan_to_num(high - med)]
        name = f"{server} (baseline)" if server == baseline else server
        rows = y + i * height - 0.4 + height / 2
        axis.barh(
            rows,
            np.nan_to_num(med),
            height,
            label=name,
            xerr=whiskers,
            capsize=2,
            color=BASELINE_COLOUR if server == baseline else f"C{i}",
        )
        for row, cell in zip(rows, cells, strict=True):
            if cell is not None:  # the figure just past the whisker, not under it
                axis.annotate(
                    bar_label(cell, metric, digits, baseline),
                    (getattr(cell, metric).high, row),
                    xytext=(4, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize="x-small",
                )
    values = [getattr(c, metric).median for c in index.values()]
    top = max((getattr(c, metric).high for c in index.values()), default=1.0)
    if values and min(values) > 0 and max(values) / min(values) > 30:
        axis.set_xscale("log")  # batch 1 and batch 256 differ by orders of magnitude
        axis.set_xlim(right=top * 3)  # room for the bar labels
        label += ", log scale"
    else:
        axis.set_xlim(0, top * 1.35)
    axis.set_title(title)
    axis.set_xlabel(label)
    axis.grid(axis="x", alpha=0.3)


def chart(summaries: list[Summary], path: Path, baseline: str | None = None) -> None:
    """Write the run's chart to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = figure(summaries, baseline)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def figure(summaries: list[Summary], baseline: str | None = None) -> Figure:
    """The run's chart as a matplotlib figure (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt
    import numpy as np

    scenarios = list(dict.fromkeys(s.scenario for s in summaries))
    servers = ordered_servers(summaries, baseline)
    index = {(s.scenario, s.server): s for s in summaries if s.status == OK}
    size = (14, max(4.5, INCHES_PER_BAR * len(scenarios) * len(servers) + 2.5))
    fig, axes = plt.subplots(1, 2, figsize=size, sharey=True, layout="constrained")
    for axis, panel in zip(axes, PANELS, strict=True):
        draw_panel(axis, panel, scenarios, servers, index, baseline)
    axes[0].set_yticks(np.arange(len(scenarios)), scenarios, fontsize="small")
    axes[0].set_ylabel("model / batch rows / protocol / connections")
    axes[0].invert_yaxis()  # first scenario on top, as in the table
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(servers), 5))
    against = f"; (N.NNx): req/s against {baseline}" if baseline else ""
    fig.suptitle(
        "Throughput and p99 latency per scenario and server\n"
        f"median of repetitions, whiskers min-max{against}",
        fontsize="medium",
    )
    return fig
