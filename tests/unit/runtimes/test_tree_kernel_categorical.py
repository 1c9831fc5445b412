"""Category splits in the tree kernel: LightGBM's rule on a hand-made split (each
category, fractions, negatives, NaN, categories past the bitset and past int32), and
LightGBM boosters with categorical features predicted to the bit as LightGBM predicts
them, on rows full of unseen, negative and NaN categories."""

from __future__ import annotations

import numpy as np
import pytest

from inferpool.runtimes.trees.forest import MAX_CATEGORY, ForestBuilder, Split, Unsupported
from tests.support.runtimes import infer, load, save_booster
from tests.unit.runtimes.test_tree_kernel_models import awkward_rows

IN = (1, 3, 40, 100)


def category_stump(nan_left: bool = False):
    """One category split on feature 0 of 2: left (categories IN) adds -1, right +1."""
    builder = ForestBuilder(n_features=2)
    leaves = {"left": -1.0, "right": 1.0}

    def describe(node):
        if node in leaves:
            return leaves[node]
        return Split(0, 0.0, "left", "right", nan_left=nan_left, categories=IN)

    builder.add_tree("root", describe)
    return builder.build(n_columns=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_category_goes_left_when_the_split_holds_it(dtype):
    forest = category_stump()
    values = {
        1.0: "left",
        3.0: "left",
        40.0: "left",
        100.0: "left",
        3.9: "left",  # truncated to 3, as LightGBM casts to int
        0.0: "right",
        2.0: "right",
        101.0: "right",
        -0.5: "right",  # truncates to category 0, which the split does not hold
        -1.0: "right",  # negative: right
        -3.0: "right",
        127.0: "right",  # inside the bitset's last word, not held
        128.0: "right",  # past the bitset
        1e9: "right",
        2.0**31: "right",  # past int32: right
        1e20: "right",
        np.inf: "right",
        -np.inf: "right",
        np.nan: "right",
    }
    rows = np.array([[value, 0.0] for value in values], dtype=dtype)
    got = forest.accumulate(rows)[:, 0]
    assert [("left" if v < 0 else "right") for v in got] == list(values.values())


def test_a_category_split_sends_nan_and_negatives_where_nan_left_says():
    forest = category_stump(nan_left=True)
    rows = np.array([[np.nan, 0.0], [-2.0, 0.0], [2.0**40, 0.0], [-0.5, 0.0], [2.0, 0.0]])
    assert forest.accumulate(rows)[:, 0].tolist() == [-1.0, -1.0, -1.0, 1.0, 1.0]


def test_category_zero_and_a_mixed_forest():
    # A category split above a numeric one, and a category split holding category 0.
    builder = ForestBuilder(n_features=2)
    tree = {
        "root": Split(1, 0.5, "cat", "num", nan_left=False, categories=None),
        "cat": Split(0, 0.0, "a", "b", nan_left=False, categories=[0]),
        "num": Split(0, 2.5, "c", "d", nan_left=True),
        "a": 1.0,
        "b": 2.0,
        "c": 3.0,
        "d": 4.0,
    }
    builder.add_tree("root", tree.__getitem__)
    forest = builder.build(n_columns=1)
    rows = np.array([[0.0, 0.0], [1e-40, 0.0], [0.9, 0.0], [1.0, 0.0], [2.5, 1.0], [9.0, 1.0]])
    assert forest.accumulate(rows)[:, 0].tolist() == [1.0, 1.0, 1.0, 2.0, 3.0, 4.0]
    assert forest.category_features() == {0: 32}
    assert list(forest.thresholds()) == [0, 1]  # the numeric splits' features only


def test_the_builder_refuses_categories_it_cannot_hold():
    builder = ForestBuilder(n_features=1)
    with pytest.raises(Unsupported, match="categories outside"):
        builder.add_bitset([-1, 2])
    with pytest.raises(Unsupported, match="categories outside"):
        builder.add_bitset([MAX_CATEGORY + 1])  # a bitset of more than 4 MiB
    assert builder.add_bitset([MAX_CATEGORY]) >= 0
    with pytest.raises(Unsupported, match="without its bitset"):
        # A category split whose threshold is not where a bitset starts.
        builder.add_arrays(
            [1, -1, -1], [2, -1, -1], [0, 0, 0], [7.0, 0, 0], [1 << 28, 0, 0], [0, 1, 2]
        )


def lightgbm_categorical(objective: str, rounds: int = 20):
    import lightgbm

    rng = np.random.default_rng(21)
    n = 1500
    X = rng.normal(size=(n, 5))
    X[:, 0] = rng.integers(0, 50, size=n)  # many categories: bitsets of several words
    X[:, 3] = rng.integers(0, 6, size=n)
    X[rng.random(n) < 0.05, 0] = np.nan
    signal = np.isin(X[:, 0], [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47])
    y = signal.astype(float) + (X[:, 3] % 2) + 0.5 * X[:, 1]
    params = {
        "objective": objective,
        "verbose": -1,
        "num_threads": 1,
        "seed": 0,
        "min_data_per_group": 5,
        "cat_smooth": 1.0,
        "max_cat_to_onehot": 4,
        "num_leaves": 15,
    }
    if objective == "binary":
        y = (y > 1.0).astype(int)
    elif objective == "multiclass":
        params["num_class"] = 3
        y = np.digitize(y, [0.7, 1.6])
    dataset = lightgbm.Dataset(X, y, categorical_feature=[0, 3])
    return lightgbm.train(params, dataset, num_boost_round=rounds)


def unseen_categories(rng, n_features: int, n: int = 600) -> np.ndarray:
    rows = rng.normal(size=(n, n_features)) * 3
    column = rng.integers(-5, 80, size=n).astype(np.float64)
    choice = rng.random(n)
    column[choice < 0.1] = np.nan
    column[(choice >= 0.1) & (choice < 0.15)] = -0.5
    column[(choice >= 0.15) & (choice < 0.2)] += 0.75
    column[(choice >= 0.2) & (choice < 0.25)] = 1e12
    column[(choice >= 0.25) & (choice < 0.3)] = 1e-36
    rows[:, 0] = column
    rows[:, 3] = rng.integers(-2, 9, size=n)
    rows[::9, 3] = np.nan
    return rows


@pytest.mark.parametrize("objective", ["binary", "multiclass", "regression"])
def test_lightgbm_with_categorical_splits_matches_the_library(tmp_path, objective):
    booster = lightgbm_categorical(objective)
    assert any(tree["num_cat"] for tree in booster.dump_model()["tree_info"])
    model = load(save_booster(tmp_path / "m", booster, "model.txt"))
    compiled = model.runtime.compiled
    assert compiled is not None, model.runtime.predictor()
    assert set(compiled.forest.category_features()) == {0, 3}
    rng = np.random.default_rng(4)
    rows = np.vstack([unseen_categories(rng, 5), awkward_rows(rng, compiled.forest)])
    outputs = ["predict", "raw_score"] + (["predict_proba"] if objective != "regression" else [])
    for dtype in (np.float64, np.float32):
        X = rows.astype(dtype)
        got = infer(model, X, outputs)
        assert np.array_equal(got["raw_score"], booster.predict(X, raw_score=True))
        values = booster.predict(X)
        if objective == "binary":
            np.testing.assert_allclose(got["predict_proba"][:, 1], values, rtol=1e-12)
        elif objective == "multiclass":
            np.testing.assert_allclose(got["predict_proba"], values, rtol=1e-12)
        else:
            assert np.array_equal(got["predict"], values)
