"""The PNG chart of a run: req/s and p99 per scenario, one bar per server, min-max whiskers."""

from __future__ import annotations

from pathlib import Path

from benchmarks.results import OK, Summary


def chart(summaries: list[Summary], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt
    import numpy as np

    scenarios = list(dict.fromkeys(s.scenario for s in summaries))
    servers = list(dict.fromkeys(s.server for s in summaries))
    index = {(s.scenario, s.server): s for s in summaries if s.status == OK}
    width = 0.8 / max(1, len(servers))
    x = np.arange(len(scenarios))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.1 * len(scenarios) + 3), 8), sharex=True)
    for metric, axis, label in (("rps", axes[0], "req/s"), ("p99_ms", axes[1], "p99 latency (ms)")):
        for i, server in enumerate(servers):
            cells = [index.get((sc, server)) for sc in scenarios]
            med = [getattr(c, metric).median if c else np.nan for c in cells]
            low = [m - getattr(c, metric).low if c else 0 for m, c in zip(med, cells, strict=True)]
            high = [
                getattr(c, metric).high - m if c else 0 for m, c in zip(med, cells, strict=True)
            ]
            axis.bar(
                x + i * width - 0.4 + width / 2,
                med,
                width,
                label=server,
                yerr=[np.nan_to_num(low), np.nan_to_num(high)],
                capsize=2,
            )
        values = [getattr(c, metric).median for c in index.values()]
        if values and min(values) > 0 and max(values) / min(values) > 30:
            axis.set_yscale("log")  # batch 1 and batch 256 differ by orders of magnitude
        axis.set_ylabel(label)
        axis.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize="small")
    axes[0].set_title("median of repetitions; whiskers: min-max")
    axes[1].set_xticks(x, scenarios, rotation=45, ha="right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
