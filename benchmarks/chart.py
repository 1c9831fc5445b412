"""The PNG chart of a run: req/s and p99 per scenario, one bar per server, min-max whiskers.

Bars are horizontal, scenarios down the page: a full run (120 scenarios x 5 servers) grows
tall, which scrolls, instead of ten thousand pixels wide.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.results import OK, Summary

INCHES_PER_BAR = 0.14


def chart(summaries: list[Summary], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt
    import numpy as np

    scenarios = list(dict.fromkeys(s.scenario for s in summaries))
    servers = list(dict.fromkeys(s.server for s in summaries))
    index = {(s.scenario, s.server): s for s in summaries if s.status == OK}
    height = 0.8 / max(1, len(servers))
    y = np.arange(len(scenarios))
    size = (13, max(4.0, INCHES_PER_BAR * len(scenarios) * len(servers) + 1.5))
    fig, axes = plt.subplots(1, 2, figsize=size, sharey=True)
    for metric, axis, label in (("rps", axes[0], "req/s"), ("p99_ms", axes[1], "p99 latency (ms)")):
        for i, server in enumerate(servers):
            cells = [index.get((sc, server)) for sc in scenarios]
            med = [getattr(c, metric).median if c else np.nan for c in cells]
            low = [m - getattr(c, metric).low if c else 0 for m, c in zip(med, cells, strict=True)]
            high = [
                getattr(c, metric).high - m if c else 0 for m, c in zip(med, cells, strict=True)
            ]
            axis.barh(
                y + i * height - 0.4 + height / 2,
                med,
                height,
                label=server,
                xerr=[np.nan_to_num(low), np.nan_to_num(high)],
                capsize=2,
            )
        values = [getattr(c, metric).median for c in index.values()]
        if values and min(values) > 0 and max(values) / min(values) > 30:
            axis.set_xscale("log")  # batch 1 and batch 256 differ by orders of magnitude
        axis.set_xlabel(label)
        axis.grid(axis="x", alpha=0.3)
        axis.xaxis.set_tick_params(labeltop=True)
    axes[0].set_yticks(y, scenarios, fontsize="small")
    axes[0].invert_yaxis()  # first scenario on top, as in the table
    axes[1].legend(fontsize="small", loc="lower right")
    fig.suptitle("median of repetitions; whiskers: min-max")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
