"""``python -m benchmarks predict``: how long each tree model of the benchmark zoo takes
to predict a batch, by its library and by inferpool's tree kernel, side by side.

Both go through the model's inferpool runtime (``Runtime.predict``, output ``predict``),
on one thread (``limit_threads(1)``, as in a worker of ``--workers`` = cores), on the rows
the load scenarios send. The time is the best of repeated runs, which damps the noise of a
shared machine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.codec_timing import best_time
from benchmarks.models import build_repository, features
from inferpool.runtimes.trees.forest import Unsupported
from inferpool.runtimes.trees.verify import FLOAT32_RTOL, RTOL, verify

TREE_MODELS = ("lightgbm", "xgboost", "forest")


def load(repo: Path, model: str, kernel: bool):
    from inferpool.engine.worker.model import load_model
    from inferpool.settings import read_model_settings

    settings = read_model_settings(repo / model, model)
    settings.parameters.extra["tree_kernel"] = kernel
    loaded = load_model(settings)
    loaded.runtime.limit_threads(1)
    return loaded.runtime


def milliseconds(runtime, matrix: np.ndarray, budget: float) -> float:
    return best_time(lambda: runtime.predict(matrix, ["predict"]), budget) * 1e3


def same_predict(library, kernel, matrix: np.ndarray) -> bool:
    """The kernel's ``predict`` is the library's, by the check it passed at load: equal,
    or for floats within its tolerance (a float32 library's last bit may differ)."""
    ours = kernel.predict(matrix, ["predict"])["predict"]
    rtol = FLOAT32_RTOL if np.asarray(ours).dtype == np.float32 else RTOL
    try:
        verify(
            {
                "predict": (
                    lambda _: ours,
                    lambda rows: library.predict(rows, ["predict"])["predict"],
                )
            },
            [matrix],
            rtol,
        )
    except Unsupported:
        return False
    return True


def measure(repo: Path, batch: int, budget: float) -> list[dict[str, object]]:
    """One row per tree model: milliseconds per batch by the library and by the kernel."""
    rows = []
    for model in TREE_MODELS:
        matrix = np.ascontiguousarray(features(model)[:batch])
        library, kernel = load(repo, model, False), load(repo, model, True)
        if kernel.predictor().startswith("the tree kernel"):
            same = same_predict(library, kernel, matrix)
            kernel_ms = milliseconds(kernel, matrix, budget)
        else:
            same, kernel_ms = None, float("nan")
        library_ms = milliseconds(library, matrix, budget)
        rows.append(
            {
                "model": model,
                "rows": batch,
                "library_ms": library_ms,
                "kernel_ms": kernel_ms,
                "same_predict": same,
                "kernel": kernel.predictor(),
            }
        )
    return rows


def main(repo: Path, batch: int = 256, budget: float = 1.0) -> int:
    build_repository(repo, list(TREE_MODELS))
    print("| model | rows | library ms | tree kernel ms | speed-up | same `predict` | kernel |")
    print("|---|---|---|---|---|---|---|")
    for row in measure(repo, batch, budget):
        ratio = row["library_ms"] / row["kernel_ms"]
        print(
            f"| {row['model']} | {row['rows']} | {row['library_ms']:.3f} | "
            f"{row['kernel_ms']:.3f} | {ratio:.1f}x | {row['same_predict']} | {row['kernel']} |"
        )
    return 0
