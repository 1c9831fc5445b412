"""Oblivious (symmetric) trees laid out for the kernel (``_kernel.oblivious``, in
``oblivious.h``): CatBoost's trees, where every level of a tree splits on one feature
against one border, so that a row's leaf is a d-bit index into the tree's 2^d leaves.

Expanded into ordinary trees, a depth-6 tree is 127 nodes walked as a chain of six
dependent loads; laid out as its six (feature, border) pairs, its six compares are
independent, and the kernel computes them side by side (benchmarks/RESULTS.md,
"CatBoost's oblivious trees": several times faster than the expanded trees).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferpool.runtimes.trees.forest import (
    KERNEL_MISSING,
    PARALLEL_ROWS,
    PARALLEL_STEPS,
    Unsupported,
    allowed_threads,
)

try:
    from inferpool.runtimes.trees import _kernel
except ImportError:  # installed without a C compiler (forest.KERNEL_MISSING)
    _kernel = None  # type: ignore[assignment]

SPLIT = np.dtype([("border", "<f4"), ("feature", "<u4")])
TREE = np.dtype([("first", "<i4"), ("depth", "<i4"), ("leaf", "<i4")])
NAN_ABOVE = 1 << 31  # a split's feature flag: a NaN counts as above the border
MAX_DEPTH = 20  # the kernel's limit (CatBoost grows at most 16 levels)


@dataclass(frozen=True)
class ObliviousTree:
    """One tree: level l's ``features[l]`` against ``borders[l]`` gives bit l of the leaf's
    index (set when the value is above the border); ``leaves``: 2^depth x width values."""

    features: list[int]
    borders: list[float]
    leaves: np.ndarray


@dataclass(frozen=True)
class ObliviousForest:
    """Oblivious trees laid out for the kernel; the features as float32, the sums as
    float64 from zero, tree by tree in order, as CatBoost computes them."""

    splits: np.ndarray
    trees: np.ndarray
    leaves: np.ndarray
    width: int
    n_features: int

    @classmethod
    def build(
        cls, trees: list[ObliviousTree], n_features: int, width: int, nan_above: set[int]
    ) -> ObliviousForest:
        """The layout of ``trees``; a NaN of a feature in ``nan_above`` counts as above
        every border (CatBoost's nan_value_treatment "AsTrue")."""
        if _kernel is None:
            raise Unsupported(KERNEL_MISSING)
        if not trees:
            raise Unsupported("the model has no trees")
        table = np.zeros(len(trees), dtype=TREE)
        splits, leaves = [], []
        first = leaf = 0
        for index, tree in enumerate(trees):
            depth = len(tree.features)
            if depth > MAX_DEPTH or tree.leaves.shape != (1 << depth, width):
                raise Unsupported(f"tree {index}: {tree.leaves.shape} leaves at depth {depth}")
            if any(not 0 <= f < n_features for f in tree.features):
                raise Unsupported(f"tree {index}: a split on a feature the model does not have")
            rows = np.zeros(depth, dtype=SPLIT)
            rows["border"] = np.asarray(tree.borders, dtype=np.float32)
            rows["feature"] = [f | (NAN_ABOVE if f in nan_above else 0) for f in tree.features]
            table[index] = (first, depth, leaf)
            splits.append(rows)
            leaves.append(tree.leaves.reshape(-1))
            first, leaf = first + depth, leaf + (1 << depth)
        if leaf >= 1 << 31:
            raise Unsupported(f"{leaf:,} leaves (the kernel takes fewer than 2^31)")
        return cls(
            splits=np.concatenate(splits),
            trees=table,
            leaves=np.ascontiguousarray(np.concatenate(leaves), dtype=np.float64),
            width=width,
            n_features=n_features,
        )

    @property
    def steps(self) -> int:
        """A row's compares through the whole forest."""
        return len(self.splits)

    def accumulate(self, matrix: object, threads: int | None = None) -> np.ndarray:
        """rows x width: the sum over trees of the leaf values each row reaches."""
        x = np.ascontiguousarray(matrix, dtype=np.float32)
        out = np.zeros((x.shape[0], self.width), dtype=np.float64)
        if x.shape[0]:
            if threads is None:
                rows = x.shape[0]
                many = rows >= PARALLEL_ROWS and rows * self.steps >= PARALLEL_STEPS
                threads = allowed_threads() if many else 1
            _kernel.oblivious(
                self.splits, self.trees, self.leaves, self.width, self.n_features, x, out, threads
            )
        return out

    def describe(self) -> str:
        depth = int(self.trees["depth"].max())
        return f"{len(self.trees)} oblivious trees, depth up to {depth}"

    def thresholds(self) -> dict[int, np.ndarray]:
        """The borders of each feature (for probe rows)."""
        features = self.splits["feature"] & ~np.uint32(NAN_ABOVE)
        borders = self.splits["border"].astype(np.float64)
        return {int(f): np.unique(borders[features == f]) for f in np.unique(features)}

    def category_features(self) -> dict[int, int]:
        return {}  # numbers only: a model with categories keeps CatBoost's predictor
