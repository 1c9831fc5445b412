"""Timing helper shared by the codec benchmark and its MLServer side (standard library only,
so MLServer's virtualenv can run it too)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_time(
    function: Callable[[], Any], budget: float, min_runs: int = 3, max_runs: int = 50
) -> float:
    """The fastest of at least ``min_runs`` runs (seconds), repeating within ``budget``
    seconds (best-of damps the noise of a shared machine)."""
    best = float("inf")
    spent = 0.0
    runs = 0
    while runs < max_runs and (runs < min_runs or spent < budget):
        start = time.perf_counter()
        function()
        elapsed = time.perf_counter() - start
        best = min(best, elapsed)
        spent += elapsed
        runs += 1
    return best
