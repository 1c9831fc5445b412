"""The check a compiled model passes before it serves: on probe rows that sit on, just
below and just above the model's own thresholds (plus zeros, tiny values and NaN), and on
a category feature each category, negative and fractional values and categories past
the model's, every output of the kernel must match the library's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from inferpool.runtimes.trees.forest import Unsupported

PROBE_ROWS = 512
# Both sides add the same leaf values in the same order, and LightGBM's links are its own
# operations with the C library's exp (``libm_exp``): equal to the bit. The tolerance is
# for a float32 library's links (XGBoost's, numpy's float32 exp against the library's),
# which pass their own: a float32 ulp is 1.2e-7 of the value.
RTOL = 1e-9
FLOAT32_RTOL = 1e-6
ATOL = 1e-12


class Thresholded(Protocol):
    """What probe rows are made from: a laid-out forest (``Forest``, ``ObliviousForest``)."""

    @property
    def n_features(self) -> int: ...
    def thresholds(self) -> dict[int, np.ndarray]: ...
    def category_features(self) -> dict[int, int]: ...


def probe_rows(
    forest: Thresholded, dtype: type = np.float64, nonfinite: bool = True, seed: int = 0
) -> np.ndarray:
    """Rows whose every feature lands on a threshold, next to one, or on a special value
    (NaN and infinities only if ``nonfinite``)."""
    rng = np.random.default_rng(seed)
    rows = rng.normal(scale=3.0, size=(PROBE_ROWS, forest.n_features))
    for feature, thresholds in forest.thresholds().items():
        finite = thresholds[np.isfinite(thresholds)].astype(dtype)
        if finite.size == 0:
            continue
        picked = rng.choice(finite, size=PROBE_ROWS)
        step = rng.integers(-1, 2, size=PROBE_ROWS)  # below, on, above the threshold
        with np.errstate(over="ignore"):  # next to the largest float: infinity, a probe too
            nudged = np.where(
                step < 0,
                np.nextafter(picked, dtype(-np.inf)),
                np.where(step > 0, np.nextafter(picked, dtype(np.inf)), picked),
            )
        rows[:, feature] = nudged
    for feature, covered in forest.category_features().items():
        categories = rng.integers(-3, covered + 4, size=PROBE_ROWS).astype(np.float64)
        odd = rng.random(PROBE_ROWS)
        # A fraction of a category, just below zero, and far past any bitset.
        categories[odd < 0.1] += 0.5
        categories[(odd >= 0.1) & (odd < 0.15)] = -0.5
        categories[(odd >= 0.15) & (odd < 0.2)] = 2.0**31 + 7
        rows[:, feature] = categories
    special = [0.0, -0.0, 1e-36, -1e-36] + ([np.nan, np.inf, -np.inf] if nonfinite else [])
    mask = rng.random(rows.shape) < 0.08
    rows[mask] = rng.choice(special, size=int(mask.sum()))
    return rows.astype(dtype)


Predict = Callable[[Any], Any]


def verify(
    outputs: dict[str, tuple[Predict, Predict]], probes: list[Any], rtol: float = RTOL
) -> None:
    """Raise ``Unsupported`` unless, for every probe matrix, each output's compiled
    function (first) gives what the library's (second) gives, within ``rtol``."""
    for rows in probes:
        for name, (compiled, native) in outputs.items():
            ours = np.asarray(compiled(rows))
            theirs = np.asarray(native(rows))
            if ours.shape != theirs.shape:
                raise Unsupported(f"{name}: shape {ours.shape}, the library's {theirs.shape}")
            if ours.dtype.kind in "fc":
                same = np.allclose(ours, theirs, rtol=rtol, atol=ATOL, equal_nan=True)
            else:
                same = np.array_equal(ours, theirs)
            if not same:
                raise Unsupported(f"{name} differs from the library's on probe rows")
