"""The tree kernel's native parts: the layout it builds (``_kernel.lay_out``) is the one
the Python builder used to build, node for node; it refuses arrays that are not a tree;
the level after which a tree's walk leaves out the rows at their leaves (``settle``) is
picked from the training rows each node saw and changes no sum; and a batch split between
threads sums to the same bits as on one thread, which the process only does when it may
use more than one."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np
import pytest

from inferpool.runtimes.trees import forest as forest_module
from inferpool.runtimes.trees.forest import (
    NAN_LEFT,
    NODE,
    TREE,
    ForestBuilder,
    Unsupported,
    allowed_threads,
)
from tests.unit.runtimes.test_tree_kernel_categorical import lightgbm_categorical
from tests.unit.runtimes.test_tree_kernel_layout import describe, random_tree


def python_layout(builder: ForestBuilder) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The layout as the Python builder laid it out before the kernel did: breadth first
    per tree, an inner node's children in the next two free slots, a leaf pointing at
    itself with +inf and NaN-left, an inner node's leaf values zero."""
    nodes: list[tuple[float, int, int]] = []
    leaves: list[np.ndarray] = []
    trees = []
    for tree in builder.tree_arrays:
        values = tree.values.reshape(len(tree.left), -1)
        first = len(nodes)
        nodes.append((0.0, 0, 0))
        leaves.append(np.zeros(builder.width))
        depth = 0
        pending = deque([(0, first, 0)])
        while pending:
            source, slot, level = pending.popleft()
            depth = max(depth, level)
            if tree.left[source] < 0:
                nodes[slot] = (np.inf, NAN_LEFT, slot)
                leaves[slot] = values[source]
                continue
            left = len(nodes)
            nodes.extend([(0.0, 0, 0)] * 2)
            leaves.extend([np.zeros(builder.width)] * 2)
            flags = int(tree.feature[source]) | int(tree.flags[source])
            nodes[slot] = (float(tree.threshold[source]), flags, left)
            pending.append((int(tree.left[source]), left, level + 1))
            pending.append((int(tree.right[source]), left + 1, level + 1))
        trees.append((first, depth, tree.column, depth))  # settle: compared apart
    return (
        np.array(nodes, dtype=NODE),
        np.concatenate(leaves),
        np.array(trees, dtype=TREE),
    )


def assert_same_layout(builder: ForestBuilder, forest: forest_module.Forest) -> None:
    """The same nodes, leaves and trees; a tree's settle level is its depth unless the
    builder was given how many training rows each node saw."""
    nodes, leaves, trees = python_layout(builder)
    assert forest.nodes.tobytes() == nodes.tobytes()
    assert forest.leaves.tobytes() == leaves.tobytes()
    for field in ("root", "depth", "column"):
        assert forest.trees[field].tolist() == trees[field].tolist()
    settles = zip(builder.tree_arrays, forest.trees["settle"], trees["depth"], strict=True)
    for tree, settle, depth in settles:
        assert settle == depth if tree.weights is None else 0 <= settle <= depth


@pytest.mark.parametrize("width", [1, 3])
def test_the_native_layout_is_the_python_layout_of_random_trees(width):
    rng = np.random.default_rng(3)
    builder = ForestBuilder(n_features=5, width=width)
    for index in range(25):
        tree = random_tree(rng, 5, 10)
        if width == 1:
            builder.add_tree(tree, describe, column=index % 2)
        else:
            builder.add_tree(
                tree,
                lambda node: [describe(node)] * 3 if isinstance(node, float) else describe(node),
            )
    forest = builder.build(n_columns=2 if width == 1 else 3)
    assert_same_layout(builder, forest)


def test_the_native_layout_of_a_random_forest_is_the_python_layout(tmp_path):
    from sklearn.ensemble import RandomForestClassifier

    from inferpool.runtimes.trees.from_sklearn import CompiledSKLearnForest, add_tree

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    model = RandomForestClassifier(n_estimators=6, random_state=0).fit(X, X[:, 0] > X[:, 1])
    compiled = CompiledSKLearnForest(model)
    builder = ForestBuilder(4, width=2)
    for estimator in model.estimators_:
        add_tree(builder, estimator.tree_, True, 2)
    assert_same_layout(builder, compiled.forest)


def test_the_native_layout_of_a_categorical_booster_is_the_python_layout():
    from inferpool.runtimes.trees.from_lightgbm import _describe

    booster = lightgbm_categorical("multiclass", rounds=5)
    dump = booster.dump_model()
    builder = ForestBuilder(int(dump["max_feature_idx"]) + 1)
    for index, tree in enumerate(dump["tree_info"]):
        builder.add_tree(tree["tree_structure"], _describe, column=index % 3)
    forest = builder.build(3)
    assert forest.bits is not None and len(forest.bits) > 0
    assert_same_layout(builder, forest)


def leaf_arrays(n: int) -> dict:
    return {
        "left": -np.ones(n, np.int64),
        "right": -np.ones(n, np.int64),
        "feature": np.zeros(n, np.int64),
        "threshold": np.zeros(n),
        "flags": np.zeros(n, np.uint32),
        "values": np.arange(n, dtype=np.float64),
    }


@pytest.mark.parametrize(
    ("left", "right", "message"),
    [
        ([1, -1, -1], [1, -1, -1], "not one tree"),  # both children the same node
        ([1, 0, -1], [2, 0, -1], "not one tree"),  # a child back to the root
        ([1, -1, -1], [5, -1, -1], "not one tree"),  # a child past the end
        ([1, -1, -1, -1], [2, -1, -1, -1], "no path reaches"),  # node 3 is unreachable
        ([1, 3, -1, -1, -1], [2, 1, -1, -1, -1], "not one tree"),  # a cycle
    ],
)
def test_arrays_that_are_not_a_tree_are_refused(left, right, message):
    builder = ForestBuilder(n_features=1)
    arrays = leaf_arrays(len(left))
    arrays["left"][:] = left
    arrays["right"][:] = right
    builder.add_arrays(**arrays)
    with pytest.raises(Unsupported, match=f"tree 0: .*{message}"):
        builder.build(1)


def test_lay_out_refuses_inconsistent_arrays():
    kernel = forest_module._kernel
    arrays = leaf_arrays(3)
    arrays["left"][0], arrays["right"][0] = 1, 2
    nodes, leaves = np.zeros(3, NODE), np.zeros(3)
    args = list(arrays.values())
    assert kernel.lay_out(*args, 1, nodes, leaves, 0) == (1, 1)
    with pytest.raises(ValueError, match="inconsistent tree arrays"):
        kernel.lay_out(*args, 1, nodes, leaves, 1)  # does not fit after slot 1
    with pytest.raises(ValueError, match="threshold has the wrong type"):
        kernel.lay_out(*args[:3], args[3].astype(np.float32), *args[4:], 1, nodes, leaves, 0)
    with pytest.raises(ValueError, match="leaves do not match"):
        kernel.lay_out(*args, 1, nodes, np.zeros(4), 0)
    bad_flags = args[4].copy()
    bad_flags[0] = 1 << 30
    with pytest.raises(ValueError, match="unknown split flags"):
        kernel.lay_out(*args[:4], bad_flags, args[5], 1, nodes, leaves, 0)
    with pytest.raises(ValueError, match="feature the model does not have"):
        kernel.lay_out(*args, 0, nodes, leaves, 0)


def caterpillar(depth: int, first_leaf_rows: float) -> dict:
    """A tree whose inner nodes each have a leaf on the left: the root's leaf saw
    ``first_leaf_rows`` of 100 training rows, the other leaves share the rest."""
    n = 2 * depth + 1
    arrays = leaf_arrays(n)
    leaf_rows = np.full(n, (100.0 - first_leaf_rows) / depth)
    leaf_rows[1] = first_leaf_rows
    weights = np.zeros(n)
    for node in range(n - 1, -1, -1):
        if node % 2 == 0 and node < n - 1:  # an inner node: its leaf and the next node
            arrays["left"][node], arrays["right"][node] = node + 1, node + 2
            weights[node] = weights[node + 1] + weights[node + 2]
        else:
            weights[node] = leaf_rows[node]
    return {**arrays, "weights": weights}


def balanced(depth: int) -> dict:
    """A complete tree, every leaf at ``depth``, every node seen by half its parent's rows."""
    n = 2 ** (depth + 1) - 1
    arrays = leaf_arrays(n)
    inner = np.arange(n // 2)
    arrays["left"][inner], arrays["right"][inner] = 2 * inner + 1, 2 * inner + 2
    levels = np.floor(np.log2(np.arange(n) + 1))
    return {**arrays, "weights": 2.0 ** (depth - levels)}


def settle_of(tree: dict, weights=...) -> tuple[int, int]:
    kernel = forest_module._kernel
    n = len(tree["left"])
    nodes, leaves = np.zeros(n, NODE), np.zeros(n)
    arrays = [tree[name] for name in ("left", "right", "feature", "threshold", "flags")]
    chosen = tree["weights"] if weights is ... else weights
    return kernel.lay_out(*arrays, tree["values"], 1, nodes, leaves, 0, chosen)


def test_a_tree_settles_where_most_training_rows_are_at_their_leaves():
    assert settle_of(caterpillar(8, first_leaf_rows=90.0)) == (8, 1)
    # Most rows walk on to the bottom: leaving the few out is not worth the list.
    assert settle_of(caterpillar(8, first_leaf_rows=2.0)) == (8, 8)
    assert settle_of(balanced(5)) == (5, 5)
    assert settle_of(caterpillar(1, first_leaf_rows=90.0)) == (1, 1)


def test_without_training_counts_a_tree_walks_every_row_to_its_depth():
    tree = caterpillar(8, first_leaf_rows=90.0)
    assert settle_of(tree, None) == (8, 8)
    for unknown in (np.full(17, np.nan), np.zeros(17), np.full(17, np.inf)):
        assert settle_of(tree, unknown) == (8, 8)
    with pytest.raises(ValueError, match="one per node"):
        settle_of(tree, np.ones(16))
    with pytest.raises(ValueError, match="float64"):
        settle_of(tree, np.ones(17, np.float32))
    with pytest.raises(Unsupported, match="differ in length"):
        ForestBuilder(n_features=1).add_arrays(**{**tree, "weights": np.ones(16)})


def with_settle(forest: forest_module.Forest, settle: np.ndarray) -> forest_module.Forest:
    trees = forest.trees.copy()
    trees["settle"] = settle
    return dataclasses.replace(forest, trees=trees)


def test_any_settle_level_gives_the_same_sums():
    """Every tree walked to its depth, or leaving its settled rows out at any level: the
    same sums to the bit, for blocks of rows and for the few-row walk, with NaN and
    category splits and rows that stop at every depth."""
    forest, rows = big_forest()
    depth = forest.trees["depth"]
    assert depth.max() >= 6 and len(set(depth.tolist())) > 3
    flat = with_settle(forest, depth).accumulate(rows[:1000], threads=1)
    rng = np.random.default_rng(8)
    for settle in (np.zeros_like(depth), depth - 1, rng.integers(0, depth + 1)):
        settled = with_settle(forest, np.maximum(settle, 0))
        assert settled.accumulate(rows[:1000], threads=1).tobytes() == flat.tobytes()
        for count in (1, 3, 5):
            got = settled.accumulate(rows[:count], threads=1)
            assert got.tobytes() == flat[:count].tobytes()


@pytest.mark.parametrize("settle", [-1, "depth + 1"])
def test_a_settle_level_outside_the_tree_is_refused(settle):
    forest, rows = big_forest()
    depth = forest.trees["depth"]
    broken = with_settle(forest, -1 if settle == -1 else depth + 1)
    with pytest.raises(ValueError, match="outside the forest layout"):
        broken.accumulate(rows[:64], threads=1)


def test_a_leaf_wise_lightgbm_booster_settles_its_trees():
    """LightGBM grows a tree leaf by leaf: most trees have leaves at many depths, and the
    importer hands the kernel their training counts, so some trees settle early."""
    import lightgbm

    from inferpool.runtimes.trees.from_lightgbm import CompiledLightGBM

    rng = np.random.default_rng(4)
    X = rng.normal(size=(4000, 8))
    y = X[:, 0] + np.where(X[:, 1] > 1.0, 3 * X[:, 2], 0.0) + rng.normal(scale=0.1, size=4000)
    booster = lightgbm.train(
        {"num_leaves": 31, "verbose": -1, "min_data_in_leaf": 5},
        lightgbm.Dataset(X, y),
        num_boost_round=20,
    )
    trees = CompiledLightGBM(booster).forest.trees
    assert (trees["settle"] < trees["depth"]).any()
    assert (trees["settle"] >= np.minimum(trees["depth"], 1)).all()


def xgboost_forest(X, y):
    import xgboost

    from inferpool.runtimes.trees.from_xgboost import CompiledXGBoost

    booster = xgboost.train({"max_depth": 4}, xgboost.DMatrix(X, y), num_boost_round=3)
    return CompiledXGBoost(booster, {}).forest


def lightgbm_forest(X, y):
    import lightgbm

    from inferpool.runtimes.trees.from_lightgbm import CompiledLightGBM

    params = {"num_leaves": 8, "verbose": -1}
    return CompiledLightGBM(lightgbm.train(params, lightgbm.Dataset(X, y), 3)).forest


def sklearn_forest(estimator):
    def build(X, y):
        from inferpool.runtimes.trees.from_sklearn import CompiledSKLearnForest
        from inferpool.runtimes.trees.from_sklearn_boosting import CompiledBoosting

        model = estimator().fit(X, y)
        compiled = CompiledBoosting if "Gradient" in estimator.__name__ else CompiledSKLearnForest
        return compiled(model).forest

    return build


def _estimators():
    from sklearn.ensemble import (
        GradientBoostingRegressor,
        HistGradientBoostingRegressor,
        RandomForestRegressor,
    )

    return [RandomForestRegressor, GradientBoostingRegressor, HistGradientBoostingRegressor]


@pytest.mark.parametrize(
    "build",
    [xgboost_forest, lightgbm_forest, *(sklearn_forest(e) for e in _estimators())],
    ids=["xgboost", "lightgbm", "random-forest", "gradient-boosting", "hist-gradient-boosting"],
)
def test_every_importer_gives_the_kernel_its_training_counts(build, monkeypatch):
    """What the settle level is chosen from: each library's count (or cover) of the
    training rows at every node, handed over with the tree."""
    seen = []
    real_build = ForestBuilder.build

    def spy(self, *args, **kwargs):
        seen.extend(tree.weights for tree in self.tree_arrays)
        return real_build(self, *args, **kwargs)

    monkeypatch.setattr(ForestBuilder, "build", spy)
    rng = np.random.default_rng(2)
    X = rng.normal(size=(500, 4))
    build(X, X[:, 0] + X[:, 1] ** 2)
    assert seen and all(weights is not None for weights in seen)
    for weights in seen:
        assert weights[0] > 0 and np.isfinite(weights).all() and (weights >= 0).all()


def big_forest():
    """A forest with numeric, NaN-aware and category splits, and rows to match."""
    rng = np.random.default_rng(5)
    builder = ForestBuilder(n_features=6, width=2)
    for _ in range(40):
        tree = random_tree(rng, 6, 12)
        builder.add_tree(
            tree, lambda node: [describe(node), 1.0] if isinstance(node, float) else describe(node)
        )
    booster = lightgbm_categorical("regression", rounds=10)
    for tree in booster.dump_model()["tree_info"]:
        from inferpool.runtimes.trees.from_lightgbm import _describe

        builder.add_tree(
            tree["tree_structure"],
            lambda node: [_describe(node), -1.0] if "leaf_value" in node else _describe(node),
        )
    forest = builder.build(n_columns=2)
    rows = rng.normal(size=(10_001, 6)) * 4
    rows[rng.random(rows.shape) < 0.05] = np.nan
    rows[:, 0] = np.round(rows[:, 0] * 5)
    return forest, rows


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [2, 3, 4, 16, 200])
def test_a_batch_split_between_threads_sums_to_the_same_bits(dtype, threads):
    forest, rows = big_forest()
    X = rows.astype(dtype)
    alone = forest.accumulate(X, threads=1)
    assert forest.accumulate(X, threads=threads).tobytes() == alone.tobytes()
    # Fewer rows than threads have blocks for, and a batch of one block.
    assert forest.accumulate(X[:70], threads=threads).tobytes() == alone[:70].tobytes()
    assert forest.accumulate(X[:5], threads=threads).tobytes() == alone[:5].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sums", [np.float64, np.float32])
def test_a_few_rows_walked_a_group_of_trees_at_a_time_sum_to_the_same_bits(dtype, sums):
    """Blocks of one to three rows take the kernel's tree-group walk, larger ones the
    row-block walk: every row has the same sum either way, NaN and category splits,
    trees of every depth and a last group of two trees (50 trees) included."""
    forest, rows = big_forest()
    forest = dataclasses.replace(forest, start=forest.start.astype(sums))
    X = rows[:64].astype(dtype)
    whole = forest.accumulate(X, threads=1)
    for count in (1, 2, 3, 4, 5):
        parts = [forest.accumulate(X[i : i + count], threads=1) for i in range(0, 60, count)]
        assert np.concatenate(parts).tobytes() == whole[:60].tobytes(), count


def test_the_process_thread_budget_follows_omp_num_threads(monkeypatch):
    import os

    cpus = len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a pool worker given one thread
    assert allowed_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    assert allowed_threads() == min(cpus, forest_module.MAX_THREADS)
    monkeypatch.delenv("OMP_NUM_THREADS")  # in-process serving: the CPUs it may use
    assert allowed_threads() == min(cpus, forest_module.MAX_THREADS)
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    assert allowed_threads() == min(cpus, forest_module.MAX_THREADS)


def test_only_a_large_batch_is_split_and_only_when_threads_are_allowed(monkeypatch):
    forest, rows = big_forest()
    calls = []
    real = forest_module._kernel

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def accumulate(self, *args):
            calls.append(args[-1])
            return real.accumulate(*args)

    monkeypatch.setattr(forest_module, "_kernel", Spy())
    monkeypatch.setattr(forest_module, "allowed_threads", lambda: 2)
    forest.accumulate(rows[: forest_module.PARALLEL_ROWS - 1])
    forest.accumulate(rows)
    assert calls == [1, 2]
    monkeypatch.setattr(forest_module, "allowed_threads", lambda: 1)  # a one-thread worker
    forest.accumulate(rows)
    assert calls[-1] == 1


def _libm_probe_values() -> np.ndarray:
    rng = np.random.default_rng(11)
    wide = rng.normal(scale=8.0, size=20_000)
    special = [0.0, -0.0, 1e-300, -1e-300, 709.78, 710.0, -745.2, -746.0, np.inf, -np.inf, np.nan]
    return np.concatenate([wide, rng.uniform(-0.999, 50.0, size=5_000), special])


@pytest.mark.parametrize(
    "convert, reference",
    [(forest_module.libm_exp, math.exp), (forest_module.libm_log1p, math.log1p)],
    ids=["exp", "log1p"],
)
def test_libm_functions_are_the_c_librarys_to_the_bit(convert, reference):
    """What LightGBM's links call: Python's math module calls the same C functions. numpy's
    own exp and log1p (vectorised on AVX-512) are not always these."""
    values = _libm_probe_values()
    if reference is math.log1p:
        values = values[~(values <= -1.0)]
    expected = []
    for value in values:
        try:
            expected.append(reference(value))
        except OverflowError:  # math raises where C gives inf
            expected.append(math.inf)
    got = convert(values)
    assert got is not values and got.dtype == np.float64
    assert np.array_equal(got.view(np.uint64), np.array(expected).view(np.uint64))


@pytest.mark.parametrize("scale", [1.0, 0.5, 2.7])
def test_libm_sigmoid_is_the_numpy_expression_around_the_c_exp_to_the_bit(scale):
    """LightGBM's binary link in one call: the same bits as the four numpy operations."""
    values = _libm_probe_values()
    expected = 1.0 / (1.0 + forest_module.libm_exp(-scale * values))
    for shaped in (values, values[:25_000].reshape(-1, 2)):
        got = forest_module.libm_sigmoid(shaped, scale)
        assert got is not shaped and got.shape == shaped.shape
        assert got.tobytes() == expected[: shaped.size].tobytes()


def test_libm_refuses_what_it_cannot_convert_in_place():
    from inferpool.runtimes.trees import _kernel

    with pytest.raises(ValueError, match="float64"):
        _kernel.libm(0, np.zeros(4, dtype=np.float32))
    with pytest.raises(TypeError, match="C-contiguous"):
        _kernel.libm(0, np.zeros((4, 4))[:, 1])
    with pytest.raises(TypeError, match="C-contiguous"):
        _kernel.libm(0, b"\0" * 8)  # read-only
    with pytest.raises(ValueError, match="function"):
        _kernel.libm(3, np.zeros(4))
