"""Saabas contributions of a tree ensemble, walked on the kernel's own layout.

Each tree adds to a row's score the value of the leaf the row reaches. Walking the row's
path from the root, every split moves the expected value from the parent node's to the
child's; Saabas credits that change to the split's feature, and the root's value to the
bias. The changes telescope, so a tree's credits plus its root's value are exactly its
leaf's value, and a row's contributions plus the bias are exactly its score (to the
rounding of the sums).

The kernel's layout (``forest.py``) keeps the leaves' values only. ``PathValues`` adds
every node's expected value, in the layout's slots: the importer's leaf values, and at an
inner node the mean of its children's values weighted by the training samples (or
weights) that reached each, computed bottom-up, so the inner values agree with the leaves
whatever the library stored at its inner nodes (scikit-learn's gradient boosting keeps
the mean residual there, before the line search that set its leaves).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inferpool.runtimes.trees.forest import Forest, Unsupported

try:
    from inferpool.runtimes.trees import _kernel
except ImportError:  # no compiled kernel: no Forest is ever built (``ForestBuilder.build``)
    _kernel = None  # type: ignore[assignment]


@dataclass(frozen=True)
class SourceTree:
    """One tree as its library holds it, root at 0: children (-1 at a leaf), each node's
    values (nodes x width; the leaves' as the kernel's importer gave them) and the
    training weight that reached each node."""

    left: np.ndarray
    right: np.ndarray
    values: np.ndarray
    weights: np.ndarray


@dataclass(frozen=True)
class PathValues:
    """A laid-out forest with every node's expected value beside it (``values``: slots x
    width, in the layout's order)."""

    forest: Forest
    values: np.ndarray

    @classmethod
    def of(cls, forest: Forest, trees: Sequence[SourceTree]) -> PathValues:
        """The values of ``trees`` (in the order they were added to ``forest``'s builder)
        placed in ``forest``'s slots; ``Unsupported`` if they are not the same trees."""
        if len(trees) != len(forest.trees):
            raise Unsupported(f"{len(trees)} trees for a forest of {len(forest.trees)}")
        sizes = np.array([len(tree.left) for tree in trees])
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        left = np.concatenate([_global(t.left, o) for t, o in zip(trees, offsets, strict=True)])
        right = np.concatenate([_global(t.right, o) for t, o in zip(trees, offsets, strict=True)])
        weights = np.concatenate([np.asarray(t.weights, np.float64) for t in trees])
        node_values = np.concatenate(
            [np.asarray(t.values, np.float64).reshape(len(t.left), -1) for t in trees]
        )
        if node_values.shape[1] != forest.width or len(left) != len(forest.nodes):
            raise Unsupported("the trees do not match the forest's layout")
        levels = _levels(forest, left, right, offsets)
        _fill_expectations(left, right, weights, node_values, levels)
        values = np.empty((len(forest.nodes), forest.width), np.float64)
        for slots, sources in levels:
            values[slots] = node_values[sources]
        leaves = forest.leaves.reshape(len(forest.nodes), forest.width)
        is_leaf = forest.nodes["left"] == np.arange(len(forest.nodes))
        if not np.array_equal(values[is_leaf], leaves[is_leaf]):
            raise Unsupported("the trees' leaf values differ from the forest's")
        return cls(forest, np.ascontiguousarray(values))

    def contributions(self, rows: np.ndarray) -> np.ndarray:
        """rows x columns x (features + 1): each feature's share of each score column, the
        last entry the bias (the root values, plus the forest's start). ``rows`` as the
        kernel reads them (``Forest.features``)."""
        forest = self.forest
        x = forest.features(rows)
        out = np.zeros((x.shape[0], forest.n_columns, forest.n_features + 1), np.float64)
        out[:, :, -1] = forest.start
        if x.shape[0]:
            _kernel.contributions(
                forest.nodes,
                self.values,
                forest.trees,
                forest.width,
                forest.n_features,
                x,
                out,
                forest.bits,
            )
        return out


def _global(children: np.ndarray, offset: int) -> np.ndarray:
    """A tree's child indices shifted to the concatenation's numbering (leaves stay -1)."""
    children = np.asarray(children, np.int64)
    return np.where(children >= 0, children + offset, -1)


def _levels(
    forest: Forest, left: np.ndarray, right: np.ndarray, offsets: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(slots, source nodes) level by level from every root at once: the layout puts an
    inner node's left child at its ``left`` slot and its right child just after."""
    slot_left = forest.nodes["left"].astype(np.int64)
    slots = forest.trees["root"].astype(np.int64)
    sources = np.asarray(offsets, np.int64)
    levels = []
    while slots.size:
        inner = left[sources] >= 0
        if not np.array_equal(inner, slot_left[slots] != slots):
            raise Unsupported("the trees' shapes differ from the forest's layout")
        levels.append((slots, sources))
        children = slot_left[slots[inner]]
        slots = np.concatenate([children, children + 1])
        sources = np.concatenate([left[sources[inner]], right[sources[inner]]])
    if sum(len(s) for s, _ in levels) != len(forest.nodes):
        raise Unsupported("the trees' sizes differ from the forest's layout")
    return levels


def _fill_expectations(
    left: np.ndarray,
    right: np.ndarray,
    weights: np.ndarray,
    values: np.ndarray,
    levels: list[tuple[np.ndarray, np.ndarray]],
) -> None:
    """Each inner node's value: its children's, weighted by the weight that reached each
    (an equal split where neither has any), deepest level first."""
    for _, sources in reversed(levels):
        inner = sources[left[sources] >= 0]
        if not inner.size:
            continue
        lo, hi = left[inner], right[inner]
        w_lo, w_hi = weights[lo], weights[hi]
        total = w_lo + w_hi
        empty = total <= 0
        w_lo = np.where(empty, 0.5, w_lo)[:, np.newaxis]
        w_hi = np.where(empty, 0.5, w_hi)[:, np.newaxis]
        total = np.where(empty, 1.0, total)[:, np.newaxis]
        values[inner] = (w_lo * values[lo] + w_hi * values[hi]) / total
