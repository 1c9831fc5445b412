"""``python -m benchmarks inprocess``: the catboost and onnx profiles' models timed in this
process, without a server: CatBoost's model by the tree kernel against CatBoost's own
predict (both through inferpool's CatBoost runtime, output ``predict``, on one thread),
and the ONNX model by ``InferenceSession.run`` called directly in a tight loop (the peer
of the onnx profile's served figures, MLServer having no ONNX runtime).

Each figure is the best of repeated runs, the sides interleaved round after round, so
that a shared machine's load weighs on both alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.codec_timing import best_time
from benchmarks.models import build_repository, features

MODELS = ("catboost", "onnx")


def catboost_sides(repo: Path) -> dict[str, Callable[[np.ndarray], Any]]:
    """CatBoost's runtime with the tree kernel and without."""
    from inferpool.engine.worker.model import load_model
    from inferpool.settings import read_model_settings

    sides = {}
    for side, kernel in (("tree kernel", True), ("CatBoost predict", False)):
        settings = read_model_settings(repo / "catboost", "catboost")
        settings.parameters.extra["tree_kernel"] = kernel
        runtime = load_model(settings).runtime
        runtime.limit_threads(1)
        if kernel and not runtime.predictor().startswith("the tree kernel"):
            raise RuntimeError(f"the tree kernel does not serve the model: {runtime.predictor()}")
        sides[side] = lambda x, runtime=runtime: runtime.predict(x, ["predict"])
    return sides


def onnx_side(repo: Path) -> dict[str, Callable[[np.ndarray], Any]]:
    """ONNX Runtime's session as a user makes it (default options), run directly."""
    import onnxruntime

    path = str(repo / "onnx" / "model.onnx")
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return {"InferenceSession.run": lambda x: session.run(None, {name: x})}


def measure(repo: Path, batches: list[int], rounds: int, budget: float) -> list[dict[str, object]]:
    """Rows per second of each side, per model and batch: the best of ``rounds``."""
    results = []
    for model, sides in (("catboost", catboost_sides(repo)), ("onnx", onnx_side(repo))):
        for batch in batches:
            x = np.ascontiguousarray(features(model)[:batch])
            best = dict.fromkeys(sides, float("inf"))
            for _ in range(rounds):  # interleaved: each side once a round
                for side, call in sides.items():
                    best[side] = min(best[side], best_time(functools.partial(call, x), budget))
            for side, seconds in best.items():
                results.append(
                    {"model": model, "batch": batch, "side": side, "calls_per_s": 1 / seconds,
                     "rows_per_s": batch / seconds}
                )  # fmt: skip
    return results


def main(repo: Path, batches: list[int], rounds: int = 5, budget: float = 0.3) -> int:
    build_repository(repo, list(MODELS))
    rows = measure(repo, batches, rounds, budget)
    print("| model | batch | side | calls/s | rows/s | vs the first side |")
    print("|---|---|---|---|---|---|")
    first: dict[tuple[object, object], float] = {}
    for row in rows:
        key = (row["model"], row["batch"])
        rate = float(row["rows_per_s"])  # type: ignore[arg-type]
        base = first.setdefault(key, rate)
        print(
            f"| {row['model']} | {row['batch']} | {row['side']} | {row['calls_per_s']:,.0f} | "
            f"{rate:,.0f} | {rate / base:.2f}x |"
        )
    return 0
