"""A tree ensemble laid out for the kernel (``_kernel.c``), and the builder that lays it out.

Nodes are stored breadth-first per tree, so a node's two children are neighbours (the
kernel steps to ``left + goes_right``) and a leaf points at itself. Importers give their
library's trees to ``ForestBuilder`` as node arrays (``add_arrays``) or node by node
(``add_tree``); the kernel lays each tree out (``_kernel.lay_out``, about 20 ms per
million nodes). Given how many training rows reached each node (``weights``), the kernel
also picks the level after which a tree's walk leaves out the rows already at their
leaves (``TREE``'s ``settle``). ``Forest.accumulate`` sums the leaf values each row
reaches, tree by tree in order, as the libraries do, on a few threads for a large batch
when the process may use them (``allowed_threads``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
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
TREE = np.dtype([("root", "<i4"), ("depth", "<i4"), ("column", "<i4"), ("settle", "<i4")])
FEATURE_LIMIT = 1 << 24
NAN_LEFT = 1 << 24
ZERO_MISSING = 1 << 25
ZERO_RIGHT = 1 << 26
ZERO_SNAP = 1 << 27
CATEGORICAL = 1 << 28
# A category split's bitset: its number of 32-bit words, then the words (``Forest.bits``).
# The largest category a bitset may hold: LightGBM's categories fit in int32, but a
# bitset reaching that far would take 256 MiB; this one takes at most 4 MiB.
MAX_CATEGORY = (1 << 25) - 1

# A batch is split between threads only when each has enough to do: thread start-up
# costs tens of microseconds, a row-step through one level of one tree a few nanoseconds.
PARALLEL_ROWS = 1024  # the fewest rows worth splitting
PARALLEL_STEPS = 2_000_000  # rows x (the depths of every tree) worth splitting
MAX_THREADS = 4  # "a few": a server's other threads need the cores too


def allowed_threads() -> int:
    """The threads this process may use for one batch: ``OMP_NUM_THREADS`` when set (a
    pool worker sets it to its share, ``engine/worker/process.limit_native_threads``; the
    template to 1), else the CPUs it may run on; at most ``MAX_THREADS``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        cpus = os.cpu_count() or 1
    setting = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    wanted = int(setting) if setting.isdigit() else cpus
    return max(1, min(wanted, cpus, MAX_THREADS))


class Unsupported(Exception):
    """The model has something the kernel does not reproduce; the message says what."""


@dataclass(frozen=True)
class Split:
    """An inner node: ``x[feature] <= threshold`` goes to ``left``.

    ``nan_left``: where a NaN goes. ``zero_missing``: |x| <= 1e-35 is a missing value and
    goes left unless ``zero_right`` (LightGBM's missing type "Zero"). ``zero_snap``: such
    a value is compared as 0.0 (LightGBM drops it from the row before predicting).
    ``categories``: a category split instead (LightGBM's rule): the value truncated to an
    integer goes left when it is one of them, right otherwise; NaN and a value that
    truncates below 0 (or past 2^31 - 1) go as ``nan_left`` says.
    """

    feature: int
    threshold: float
    left: Any
    right: Any
    nan_left: bool
    zero_missing: bool = False
    zero_right: bool = False
    zero_snap: bool = False
    categories: Sequence[int] | None = None


#: a tree's node arrays as ``ForestBuilder.add_arrays`` takes them: left, right, feature,
#: threshold, flags, values
NodeArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]

#: how an importer describes one node of its tree: a Split, or the leaf's value(s)
Describe = Callable[[Any], Split | float | Sequence[float] | np.ndarray]


def split_flags(split: Split) -> int:
    """The kernel's flag bits for a split's rules (not its feature)."""
    flags = NAN_LEFT if split.nan_left else 0
    flags |= ZERO_MISSING if split.zero_missing else 0
    flags |= ZERO_RIGHT if split.zero_right else 0
    flags |= ZERO_SNAP if split.zero_snap else 0
    return flags | (CATEGORICAL if split.categories is not None else 0)


@dataclass(frozen=True)
class TreeArrays:
    """One tree as node arrays, its root at 0: children (-1 at a leaf), the split's
    feature, threshold (a category split: where its bitset starts) and flag bits, and
    ``values`` (nodes x width) holding each leaf's values; ``weights``: the training rows
    (or their weight) that reached each node, None when the library does not keep them."""

    left: np.ndarray
    right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    flags: np.ndarray
    values: np.ndarray
    column: int
    weights: np.ndarray | None = None


class ForestBuilder:
    """Collects trees, each adding ``width`` values per row from output column ``column``."""

    def __init__(self, n_features: int, width: int = 1) -> None:
        if n_features >= FEATURE_LIMIT:
            raise Unsupported(f"{n_features} features (the kernel takes fewer than 2^24)")
        self.n_features = n_features
        self.width = width
        self.tree_arrays: list[TreeArrays] = []
        self._bits: list[np.ndarray] = []
        self._bits_size = 0
        self._bitset_starts: list[int] = []

    def add_arrays(
        self,
        left: Any,
        right: Any,
        feature: Any,
        threshold: Any,
        flags: Any,
        values: Any,
        column: int = 0,
        weights: Any = None,
    ) -> None:
        """Add a tree given as node arrays (``TreeArrays``); ``values`` may be one value
        per node when ``width`` is 1."""
        tree = TreeArrays(
            left=np.ascontiguousarray(left, dtype=np.int64),
            right=np.ascontiguousarray(right, dtype=np.int64),
            feature=np.ascontiguousarray(feature, dtype=np.int64),
            threshold=np.ascontiguousarray(threshold, dtype=np.float64),
            flags=np.ascontiguousarray(flags, dtype=np.uint32),
            values=np.ascontiguousarray(values, dtype=np.float64),
            column=column,
            weights=None if weights is None else np.ascontiguousarray(weights, dtype=np.float64),
        )
        n = len(tree.left)
        lengths = [tree.right, tree.feature, tree.threshold]
        if tree.weights is not None:
            lengths.append(tree.weights)
        if n == 0 or not all(len(a) == n for a in lengths):
            raise Unsupported("a tree whose node arrays differ in length")
        values_per_node = tree.values.size // n if tree.values.size % n == 0 else -1
        if values_per_node != self.width:
            raise Unsupported(f"a leaf with {tree.values.size / n:g} values, expected {self.width}")
        inner = tree.left >= 0
        features = tree.feature[inner]
        outside = features[(features < 0) | (features >= self.n_features)]
        if outside.size:
            raise Unsupported(f"a split on feature {outside[0]} of {self.n_features}")
        # The kernel reads a category split's bitset where its threshold says: only where
        # ``add_bitset`` put one.
        categorical = inner & ((tree.flags & CATEGORICAL) != 0)
        if not np.isin(tree.threshold[categorical], self._bitset_starts).all():
            raise Unsupported("a category split without its bitset")
        self.tree_arrays.append(tree)

    def add_bitset(self, categories: Iterable[int]) -> int:
        """Store the bitset of ``categories`` (each 0..MAX_CATEGORY) and return where it
        starts in ``Forest.bits`` (a category split's threshold)."""
        chosen = np.fromiter((int(c) for c in categories), dtype=np.int64)
        if chosen.size and (chosen.min() < 0 or chosen.max() > MAX_CATEGORY):
            raise Unsupported(f"a category split on categories outside 0..{MAX_CATEGORY}")
        n_words = int(chosen.max()) // 32 + 1 if chosen.size else 0
        words = np.zeros(n_words + 1, dtype=np.uint32)
        words[0] = n_words
        np.bitwise_or.at(words, 1 + chosen // 32, np.left_shift(1, chosen % 32).astype(np.uint32))
        offset = self._bits_size
        self._bitset_starts.append(offset)
        self._bits.append(words)
        self._bits_size += len(words)
        return offset

    def add_tree(
        self,
        root: Any,
        describe: Describe,
        column: int = 0,
        weigh: Callable[[Any], float] | None = None,
    ) -> None:
        """Add a tree described node by node: ``describe(ref)`` of the root, then of each
        split's ``left`` and ``right`` refs; ``weigh(ref)``: the node's training rows."""
        refs = [root]
        left: list[int] = []
        right: list[int] = []
        feature: list[int] = []
        threshold: list[float] = []
        flags: list[int] = []
        values: list[np.ndarray] = []
        inner = np.zeros(self.width)  # an inner node's (unused) leaf values, shared
        for ref in refs:  # refs grows as splits are read: a breadth-first walk
            node = describe(ref)
            if not isinstance(node, Split):
                leaf = np.asarray(node, dtype=np.float64).reshape(-1)
                if leaf.size != self.width:
                    raise Unsupported(f"a leaf with {leaf.size} values, expected {self.width}")
                left.append(-1)
                right.append(-1)
                feature.append(0)
                threshold.append(0.0)
                flags.append(0)
                values.append(leaf)
                continue
            if not 0 <= node.feature < self.n_features:
                raise Unsupported(f"a split on feature {node.feature} of {self.n_features}")
            left.append(len(refs))
            right.append(len(refs) + 1)
            refs += (node.left, node.right)
            feature.append(node.feature)
            if node.categories is not None:  # the threshold says where its bitset starts
                threshold.append(self.add_bitset(node.categories))
            else:
                threshold.append(float(node.threshold))
            flags.append(split_flags(node))
            values.append(inner)
        weights = None if weigh is None else [weigh(ref) for ref in refs]
        self.add_arrays(left, right, feature, threshold, flags, np.vstack(values), column, weights)

    def build(
        self,
        n_columns: int,
        input_dtype: DTypeLike | None = None,
        sum_dtype: type = np.float64,
        start: Sequence[float] | np.ndarray | None = None,
    ) -> Forest:
        if _kernel is None:
            raise Unsupported(KERNEL_MISSING)
        if not self.tree_arrays:
            raise Unsupported("the model has no trees")
        total = sum(len(tree.left) for tree in self.tree_arrays)
        if total >= 1 << 31:
            raise Unsupported(f"{total:,} nodes (the kernel takes fewer than 2^31)")
        nodes = np.empty(total, dtype=NODE)
        leaves = np.empty((total, self.width), dtype=np.float64)
        trees = np.empty(len(self.tree_arrays), dtype=TREE)
        first = 0
        for index, tree in enumerate(self.tree_arrays):
            try:
                depth, settle = _kernel.lay_out(
                    tree.left,
                    tree.right,
                    tree.feature,
                    tree.threshold,
                    tree.flags,
                    tree.values,
                    self.n_features,
                    nodes,
                    leaves,
                    first,
                    tree.weights,
                )
            except ValueError as exc:
                raise Unsupported(f"tree {index}: {exc}") from None
            trees[index] = (first, depth, tree.column, settle)
            first += len(tree.left)
        bits = np.concatenate(self._bits) if self._bits else None
        return Forest(
            nodes=nodes,
            leaves=leaves.reshape(-1),
            trees=trees,
            width=self.width,
            n_features=self.n_features,
            n_columns=n_columns,
            start=np.asarray(start if start is not None else np.zeros(n_columns), sum_dtype),
            input_dtype=input_dtype,
            bits=bits,
        )


@dataclass(frozen=True)
class Forest:
    """A laid-out forest. ``input_dtype``: the type the library compares features in
    (scikit-learn: float32); None keeps float32 and float64 as they come, as LightGBM does.
    The sums start from ``start`` (XGBoost's base margin; zeros otherwise), in its dtype:
    the precision the library adds leaf values in (XGBoost: float32, else float64).
    ``bits``: the bitsets of the category splits (None: the forest has none)."""

    nodes: np.ndarray
    leaves: np.ndarray
    trees: np.ndarray
    width: int
    n_features: int
    n_columns: int
    start: np.ndarray  # the sums' first values, one per column, in the sums' dtype
    input_dtype: DTypeLike | None = None
    bits: np.ndarray | None = None
    #: a row's steps through the whole forest (the sum of the trees' depths)
    steps: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", int(self.trees["depth"].sum()))

    def features(self, matrix: Any) -> np.ndarray:
        """The rows as the kernel reads them: C order, float32 or float64."""
        dtype: DTypeLike | None = self.input_dtype
        if dtype is None:
            kind = getattr(matrix, "dtype", None)
            dtype = kind if kind in (np.float32, np.float64) else np.float32
        return np.ascontiguousarray(matrix, dtype=dtype)

    def threads_for(self, rows: int) -> int:
        """Threads worth giving a batch of ``rows``: one unless the batch is large and the
        process may use more (``allowed_threads``)."""
        if rows < PARALLEL_ROWS or rows * self.steps < PARALLEL_STEPS:
            return 1
        return allowed_threads()

    def accumulate(self, matrix: Any, threads: int | None = None) -> np.ndarray:
        """rows x n_columns: the sum over trees of the leaf values each row reaches, on
        ``threads`` threads (default: ``threads_for``); the same sums on any number."""
        x = self.features(matrix)
        out = np.empty((x.shape[0], self.n_columns), self.start.dtype)
        out[:] = self.start
        if x.shape[0]:
            _kernel.accumulate(
                self.nodes,
                self.leaves,
                self.trees,
                self.width,
                self.n_features,
                x,
                out,
                self.bits,
                threads if threads is not None else self.threads_for(x.shape[0]),
            )
        return out

    def scores(self, matrix: Any) -> np.ndarray:
        """``accumulate`` shaped as the libraries shape scores: one column is 1-D."""
        sums = self.accumulate(matrix)
        return sums[:, 0] if self.n_columns == 1 else sums

    def describe(self) -> str:
        depth = int(self.trees["depth"].max())
        return f"{len(self.trees)} trees, {len(self.nodes)} nodes, depth up to {depth}"

    def _inner(self) -> np.ndarray:
        inner: np.ndarray = self.nodes[self.nodes["left"] != np.arange(len(self.nodes))]
        return inner

    def thresholds(self) -> dict[int, np.ndarray]:
        """The numeric split thresholds on each feature (for probe rows)."""
        inner = self._inner()
        inner = inner[(inner["feature_flags"] & CATEGORICAL) == 0]
        features = inner["feature_flags"] & (FEATURE_LIMIT - 1)
        return {int(f): np.unique(inner["threshold"][features == f]) for f in np.unique(features)}

    def category_features(self) -> dict[int, int]:
        """The features with category splits, each with the number of categories its
        largest bitset covers (for probe rows)."""
        if self.bits is None:
            return {}
        inner = self._inner()
        inner = inner[(inner["feature_flags"] & CATEGORICAL) != 0]
        covered: dict[int, int] = {}
        for node in inner:
            feature = int(node["feature_flags"] & (FEATURE_LIMIT - 1))
            words = int(self.bits[int(node["threshold"])])
            covered[feature] = max(covered.get(feature, 0), 32 * words)
        return covered


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax, as XGBoost computes it (max subtracted first), in the scores'
    precision (float32: within XGBoost's tolerance, ``verify``)."""
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    probabilities: np.ndarray = shifted / shifted.sum(axis=1, keepdims=True)
    return probabilities


# The C library's functions, as LightGBM's link functions call them (``_kernel.libm``):
# numpy's exp and log1p are numpy's own vectorised code on CPUs with AVX-512, and their
# last bit then differs from the C library's for a few values in a hundred.
_EXP, _LOG1P, _SIGMOID = 0, 1, 2


def _libm(function: int, values: np.ndarray, scale: float = 1.0) -> np.ndarray:
    out = np.array(values, dtype=np.float64, order="C")
    _kernel.libm(function, out, scale)
    return out


def libm_exp(values: np.ndarray) -> np.ndarray:
    """exp of every value (as float64) by the C library's exp, in a new array."""
    return _libm(_EXP, values)


def libm_log1p(values: np.ndarray) -> np.ndarray:
    """log1p of every value (as float64) by the C library's log1p, in a new array."""
    return _libm(_LOG1P, values)


def libm_sigmoid(values: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """``1.0 / (1.0 + libm_exp(-scale * values))`` to the bit, in one call, in a new array."""
    return _libm(_SIGMOID, values, scale)


def softmax_in_order(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax as LightGBM computes it, to the bit: the row's max subtracted, the
    C library's exp, and the sum taken from the first column to the last (numpy's sum is
    pairwise past eight columns)."""
    shifted = libm_exp(scores - scores.max(axis=1, keepdims=True))
    total = shifted[:, 0].copy()
    for column in range(1, shifted.shape[1]):
        total += shifted[:, column]
    probabilities: np.ndarray = shifted / total[:, None]
    return probabilities
