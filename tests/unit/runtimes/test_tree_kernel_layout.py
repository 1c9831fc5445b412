"""The tree kernel on hand-made trees: each split rule (threshold, NaN, LightGBM's zero
handling), float32 and float64 rows, blocks of rows, several output columns, and the
checks that keep a bad layout or bad rows out of the C code."""

from __future__ import annotations

import numpy as np
import pytest

from inferpool.runtimes.trees import forest as forest_module
from inferpool.runtimes.trees.forest import ForestBuilder, Split, Unsupported

TINY = float(np.float32(1e-35))  # LightGBM's kZeroThreshold, as a double


def test_the_kernel_is_built():
    # CI machines have a C compiler: a kernel that silently failed to build is a failure
    # here (every model would fall back to its library), not a reason to skip.
    assert forest_module.KERNEL_AVAILABLE, forest_module.KERNEL_MISSING


def stump(threshold: float = 0.5, **rules) -> forest_module.Forest:
    """One split on feature 1 of 2: left adds -1, right adds +1."""
    builder = ForestBuilder(n_features=2)
    leaves = {"left": -1.0, "right": 1.0}

    def describe(node):
        if node in leaves:
            return leaves[node]
        return Split(feature=1, threshold=threshold, left="left", right="right", **rules)

    builder.add_tree("root", describe)
    return builder.build(n_columns=1)


def goes(forest, value: float, dtype=np.float64) -> str:
    rows = np.array([[123.0, value]], dtype=dtype)
    return {-1.0: "left", 1.0: "right"}[forest.accumulate(rows)[0, 0]]


def test_values_up_to_the_threshold_go_left():
    forest = stump(0.5, nan_left=False)
    assert goes(forest, 0.5) == "left"
    assert goes(forest, np.nextafter(0.5, 1)) == "right"
    assert goes(forest, -np.inf) == "left"
    assert goes(forest, np.inf) == "right"


@pytest.mark.parametrize("nan_left", [True, False])
def test_nan_follows_the_nodes_rule(nan_left):
    forest = stump(0.5, nan_left=nan_left)
    assert goes(forest, np.nan) == ("left" if nan_left else "right")
    assert goes(forest, np.nan, np.float32) == ("left" if nan_left else "right")


@pytest.mark.parametrize("zero_right", [True, False])
def test_zero_as_missing_sends_zero_and_tiny_values_the_default_way(zero_right):
    # Threshold far below zero: by the compare every one of these would go right.
    forest = stump(-5.0, nan_left=not zero_right, zero_missing=True, zero_right=zero_right)
    expected = "right" if zero_right else "left"
    for value in (0.0, -0.0, 1e-36, -TINY, TINY):
        assert goes(forest, value) == expected, value
    assert goes(forest, 2 * TINY) == "right"
    assert goes(forest, -6.0) == "left"


def test_zero_snap_compares_tiny_values_as_zero():
    # LightGBM drops |x| <= 1e-35 from a row: -1e-36 is then 0.0 > -TINY, so it goes right.
    plain = stump(-TINY, nan_left=True)
    snapped = stump(-TINY, nan_left=True, zero_snap=True)
    assert goes(plain, -TINY) == "left"
    assert goes(snapped, -TINY) == "right"
    assert goes(snapped, -2 * TINY) == "left"


def random_tree(rng, n_features: int, depth: int):
    """A nested random tree and a reference walk over it, for whole-forest checks."""
    if depth == 0 or rng.random() < 0.15:
        return float(rng.normal())
    return {
        "feature": int(rng.integers(n_features)),
        "threshold": float(rng.normal()),
        "nan_left": bool(rng.random() < 0.5),
        "left": random_tree(rng, n_features, depth - 1),
        "right": random_tree(rng, n_features, depth - 1),
    }


def describe(node):
    if isinstance(node, float):
        return node
    return Split(node["feature"], node["threshold"], node["left"], node["right"], node["nan_left"])


def walk(node, row) -> float:
    while not isinstance(node, float):
        value = row[node["feature"]]
        left = node["nan_left"] if np.isnan(value) else value <= node["threshold"]
        node = node["left"] if left else node["right"]
    return node


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_random_forest_matches_a_reference_walk_across_blocks(dtype):
    rng = np.random.default_rng(7)
    n_features, n_columns = 6, 3
    trees = [random_tree(rng, n_features, 9) for _ in range(12)]
    builder = ForestBuilder(n_features)
    for index, tree in enumerate(trees):
        builder.add_tree(tree, describe, column=index % n_columns)
    forest = builder.build(n_columns)
    rows = rng.normal(size=(203, n_features)).astype(dtype)  # 203: three full blocks and a part
    rows[rng.random(rows.shape) < 0.05] = np.nan
    expected = np.zeros((len(rows), n_columns))
    for index, tree in enumerate(trees):
        for r, row in enumerate(rows.astype(np.float64)):
            expected[r, index % n_columns] += walk(tree, row)
    assert np.array_equal(forest.accumulate(rows), expected)
    assert forest.accumulate(rows[:0]).shape == (0, n_columns)
    # Fewer than four rows walk eight trees at a time (12 trees: a group and a part).
    for count in (1, 2, 3):
        assert np.array_equal(forest.accumulate(rows[:count]), expected[:count]), count


def test_leaves_with_several_values_add_to_consecutive_columns():
    builder = ForestBuilder(n_features=1, width=2)
    values = {"l": [1.0, 0.0], "r": [0.25, 0.75]}

    def describe(node):
        return values[node] if node in values else Split(0, 0.0, "l", "r", nan_left=True)

    builder.add_tree("root", describe)
    builder.add_tree("root", describe)
    forest = builder.build(n_columns=2)
    got = forest.accumulate(np.array([[-1.0], [1.0]]))
    assert np.array_equal(got, [[2.0, 0.0], [0.5, 1.5]])


@pytest.mark.parametrize("dtype", ["<f4", ">f4", "<f8", ">f8"])
def test_rows_in_either_byte_order_are_read_as_numbers(dtype):
    # Raw gRPC contents arrive as np.frombuffer(..., "<f4"): an explicit byte order.
    forest = stump(0.5, nan_left=False)
    rows = np.frombuffer(np.array([[0.0, 0.0], [0.0, 1.0]], dtype=dtype).tobytes(), dtype=dtype)
    assert forest.accumulate(rows.reshape(2, 2))[:, 0].tolist() == [-1.0, 1.0]


def test_integer_rows_are_compared_as_float32():
    forest = stump(0.5, nan_left=False)
    assert forest.accumulate(np.array([[0, 0], [0, 1]]))[:, 0].tolist() == [-1.0, 1.0]


def test_the_kernel_rejects_bad_rows_and_layouts():
    forest = stump(0.5, nan_left=False)
    kernel = forest_module._kernel
    args = (forest.nodes, forest.leaves, forest.trees, forest.width, forest.n_features)
    out = np.zeros((2, 1))
    with pytest.raises(ValueError, match="2-D float32 or float64"):
        kernel.accumulate(*args, np.zeros(4), out)
    with pytest.raises(ValueError, match="2-D float32 or float64"):
        kernel.accumulate(*args, np.zeros((2, 1)), out)  # fewer columns than features
    with pytest.raises(ValueError, match="2-D float32 or float64"):
        kernel.accumulate(*args, np.zeros((2, 2), dtype=np.int64), out)
    with pytest.raises(ValueError, match="a row per row"):
        kernel.accumulate(*args, np.zeros((3, 2)), out)
    with pytest.raises(TypeError, match="C-contiguous"):
        kernel.accumulate(*args, np.zeros((2, 4))[:, ::2], out)
    bad_trees = forest.trees.copy()
    bad_trees["root"] = len(forest.nodes)
    with pytest.raises(ValueError, match="outside the forest"):
        kernel.accumulate(forest.nodes, forest.leaves, bad_trees, 1, 2, np.zeros((2, 2)), out)
    with pytest.raises(ValueError, match="inconsistent"):
        kernel.accumulate(
            forest.nodes, forest.leaves[:-1], forest.trees, 1, 2, np.zeros((2, 2)), out
        )


def test_the_builder_refuses_what_the_kernel_cannot_hold():
    builder = ForestBuilder(n_features=2)
    with pytest.raises(Unsupported, match="feature 5 of 2"):
        builder.add_tree("root", lambda node: Split(5, 0.0, 1.0, 1.0, nan_left=True))
    with pytest.raises(Unsupported, match="2 values, expected 1"):
        ForestBuilder(n_features=2).add_tree("root", lambda node: [1.0, 2.0])
    with pytest.raises(Unsupported, match="no trees"):
        ForestBuilder(n_features=2).build(1)


def test_without_the_built_kernel_the_builder_says_so(monkeypatch):
    monkeypatch.setattr(forest_module, "_kernel", None)
    builder = ForestBuilder(n_features=1)
    builder.add_tree("root", lambda node: 1.0)
    with pytest.raises(Unsupported, match=r"not compiled in .*pip install -e"):
        builder.build(1)
