"""A tree ensemble laid out for the kernel (``_kernel.c``), and the builder that lays it out.

Nodes are stored breadth-first per tree, so a node's two children are neighbours (the
kernel steps to ``left + goes_right``) and a leaf points at itself. Importers describe
their library's trees through ``ForestBuilder.add_tree``; ``Forest.accumulate`` sums the
leaf values each row reaches, tree by tree in order, as the libraries do.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

try:
    from inferpool.runtimes.trees import _kernel
except ImportError:  # installed without a C compiler: setup.py builds it as optional
    _kernel = None  # type: ignore[assignment]

KERNEL_AVAILABLE = _kernel is not None
# Why the kernel is missing: no compiler at install, or (the usual case) a source checkout
# that shadows the installed package, whose compiled module sits in site-packages.
KERNEL_MISSING = (
    f"inferpool's tree kernel is not compiled in {__file__.rsplit('/', 1)[0]} "
    "(install with a C compiler; in a source checkout, `pip install -e .`)"
)

NODE = np.dtype([("threshold", "<f8"), ("feature_flags", "<u4"), ("left", "<i4")])
TREE = np.dtype([("root", "<i4"), ("depth", "<i4"), ("column", "<i4")])
FEATURE_LIMIT = 1 << 24
NAN_LEFT = 1 << 24
ZERO_MISSING = 1 << 25
ZERO_RIGHT = 1 << 26
ZERO_SNAP = 1 << 27


class Unsupported(Exception):
    """The model has something the kernel does not reproduce; the message says what."""


@dataclass(frozen=True)
class Split:
    """An inner node: ``x[feature] <= threshold`` goes to ``left``.

    ``nan_left``: where a NaN goes. ``zero_missing``: |x| <= 1e-35 is a missing value and
    goes left unless ``zero_right`` (LightGBM's missing type "Zero"). ``zero_snap``: such
    a value is compared as 0.0 (LightGBM drops it from the row before predicting).
    """

    feature: int
    threshold: float
    left: Any
    right: Any
    nan_left: bool
    zero_missing: bool = False
    zero_right: bool = False
    zero_snap: bool = False


#: how an importer describes one node of its tree: a Split, or the leaf's value(s)
Describe = Callable[[Any], Split | float | Sequence[float] | np.ndarray]


class ForestBuilder:
    """Collects trees, each adding ``width`` values per row from output column ``column``."""

    def __init__(self, n_features: int, width: int = 1) -> None:
        if n_features >= FEATURE_LIMIT:
            raise Unsupported(f"{n_features} features (the kernel takes fewer than 2^24)")
        self.n_features = n_features
        self.width = width
        self.nodes: list[tuple[float, int, int]] = []
        self.leaves: list[np.ndarray] = []
        self.trees: list[tuple[int, int, int]] = []
        self._inner = np.zeros(width)  # an inner node's (unused) leaf values, shared

    def add_tree(self, root: Any, describe: Describe, column: int = 0) -> None:
        first = len(self.nodes)
        self._reserve(1)
        depth = 0
        pending = deque([(root, first, 0)])
        while pending:
            ref, slot, level = pending.popleft()
            depth = max(depth, level)
            node = describe(ref)
            if not isinstance(node, Split):
                self._leaf(slot, node)
                continue
            if not 0 <= node.feature < self.n_features:
                raise Unsupported(f"a split on feature {node.feature} of {self.n_features}")
            left = len(self.nodes)
            self._reserve(2)
            flags = node.feature
            flags |= NAN_LEFT if node.nan_left else 0
            flags |= ZERO_MISSING if node.zero_missing else 0
            flags |= ZERO_RIGHT if node.zero_right else 0
            flags |= ZERO_SNAP if node.zero_snap else 0
            self.nodes[slot] = (float(node.threshold), flags, left)
            pending.append((node.left, left, level + 1))
            pending.append((node.right, left + 1, level + 1))
        self.trees.append((first, depth, column))

    def _reserve(self, count: int) -> None:
        self.nodes.extend([(0.0, 0, 0)] * count)
        self.leaves.extend([self._inner] * count)

    def _leaf(self, slot: int, value: Any) -> None:
        values = np.asarray(value, dtype=np.float64).reshape(-1)
        if values.size != self.width:
            raise Unsupported(f"a leaf with {values.size} values, expected {self.width}")
        # +inf: every number stays, and NaN_LEFT keeps a NaN here too.
        self.nodes[slot] = (np.inf, NAN_LEFT, slot)
        self.leaves[slot] = values

    def build(
        self,
        n_columns: int,
        input_dtype: DTypeLike | None = None,
        sum_dtype: type = np.float64,
        start: Sequence[float] | np.ndarray | None = None,
    ) -> Forest:
        if _kernel is None:
            raise Unsupported(KERNEL_MISSING)
        if not self.trees:
            raise Unsupported("the model has no trees")
        return Forest(
            nodes=np.array(self.nodes, dtype=NODE),
            leaves=np.ascontiguousarray(np.concatenate(self.leaves)),
            trees=np.array(self.trees, dtype=TREE),
            width=self.width,
            n_features=self.n_features,
            n_columns=n_columns,
            start=np.asarray(start if start is not None else np.zeros(n_columns), sum_dtype),
            input_dtype=input_dtype,
        )


@dataclass(frozen=True)
class Forest:
    """A laid-out forest. ``input_dtype``: the type the library compares features in
    (scikit-learn: float32); None keeps float32 and float64 as they come, as LightGBM does.
    The sums start from ``start`` (XGBoost's base margin; zeros otherwise), in its dtype:
    the precision the library adds leaf values in (XGBoost: float32, else float64)."""

    nodes: np.ndarray
    leaves: np.ndarray
    trees: np.ndarray
    width: int
    n_features: int
    n_columns: int
    start: np.ndarray  # the sums' first values, one per column, in the sums' dtype
    input_dtype: DTypeLike | None = None

    def features(self, matrix: Any) -> np.ndarray:
        """The rows as the kernel reads them: C order, float32 or float64."""
        dtype: DTypeLike | None = self.input_dtype
        if dtype is None:
            kind = getattr(matrix, "dtype", None)
            dtype = kind if kind in (np.float32, np.float64) else np.float32
        return np.ascontiguousarray(matrix, dtype=dtype)

    def accumulate(self, matrix: Any) -> np.ndarray:
        """rows x n_columns: the sum over trees of the leaf values each row reaches."""
        x = self.features(matrix)
        out = np.empty((x.shape[0], self.n_columns), self.start.dtype)
        out[:] = self.start
        if x.shape[0]:
            _kernel.accumulate(
                self.nodes, self.leaves, self.trees, self.width, self.n_features, x, out
            )
        return out

    def scores(self, matrix: Any) -> np.ndarray:
        """``accumulate`` shaped as the libraries shape scores: one column is 1-D."""
        sums = self.accumulate(matrix)
        return sums[:, 0] if self.n_columns == 1 else sums

    def describe(self) -> str:
        depth = int(self.trees["depth"].max())
        return f"{len(self.trees)} trees, {len(self.nodes)} nodes, depth up to {depth}"

    def thresholds(self) -> dict[int, np.ndarray]:
        """The split thresholds on each feature (for probe rows)."""
        inner = self.nodes[self.nodes["left"] != np.arange(len(self.nodes))]
        features = inner["feature_flags"] & (FEATURE_LIMIT - 1)
        return {int(f): np.unique(inner["threshold"][features == f]) for f in np.unique(features)}


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax, as both boosting libraries compute it (max subtracted first), in
    the scores' precision."""
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    probabilities: np.ndarray = shifted / shifted.sum(axis=1, keepdims=True)
    return probabilities
