"""scikit-learn's HistGradientBoosting and a LightGBM booster with categorical splits in a
real server, predicted by the tree kernel: the load log says so, and REST and raw gRPC
answers (rows with NaN and unseen categories, and a batch large enough to be split
between threads when models run in the server process and the process may use more than
one) are the library's to the bit."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support import rest_output
from tests.support.grpc import models_server
from tests.support.runtimes import N_FEATURES, save_booster, save_pickle

server = models_server  # the module's server fixture, over its models

LABELS = np.array(["low", "middle", "high"])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    import lightgbm
    from sklearn.ensemble import HistGradientBoostingClassifier

    root = tmp_path_factory.mktemp("boosting")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(800, N_FEATURES))
    y = np.digitize(X[:, 0] - X[:, 1] + X[:, 2] ** 2, [-0.5, 1.0])
    X[rng.random(X.shape) < 0.1] = np.nan
    hgb = HistGradientBoostingClassifier(max_iter=30, random_state=0).fit(X, LABELS[y])
    categories = X.copy()
    categories[:, 0] = rng.integers(0, 30, size=len(X))
    booster = lightgbm.train(
        {
            "objective": "binary",
            "verbose": -1,
            "num_threads": 1,
            "min_data_per_group": 5,
            "cat_smooth": 1.0,
        },
        lightgbm.Dataset(
            categories, (categories[:, 0] % 3 == 0) ^ (y > 0), categorical_feature=[0]
        ),
        num_boost_round=20,
    )
    save_pickle(root / "hgb", hgb)
    save_booster(root / "lgb-categorical", booster, "model.txt")
    references = {
        "hgb": hgb.predict_proba,
        "lgb-categorical": lambda rows: np.column_stack(
            [1 - booster.predict(rows), booster.predict(rows)]
        ),
    }
    return root, references


def test_the_log_says_the_tree_kernel_serves_both(server):
    log = server.output()
    for model in ("hgb", "lgb-categorical"):
        assert re.search(rf"model '{model}': .*predicted by the tree kernel \(\d+ trees", log), log


def request_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    rows = rng.normal(size=(n, N_FEATURES))
    rows[rng.random(rows.shape) < 0.05] = np.nan
    rows[:, 0] = np.where(rng.random(n) < 0.9, rng.integers(-3, 40, size=n), rows[:, 0])
    return rows


def test_rest_answers_match_the_library(server, models):
    rows = request_rows(np.random.default_rng(1), 40)
    rows = np.nan_to_num(rows, nan=0.0)  # JSON carries no NaN
    for model in ("hgb", "lgb-categorical"):
        got = rest_output(server.url, model, rows)
        assert np.array_equal(got, models[1][model](rows)), model


@pytest.mark.parametrize("n_rows", [256, 6000])  # 6000: split between threads in-process
@pytest.mark.parametrize("model", ["hgb", "lgb-categorical"])
def test_raw_grpc_batch_with_nan_matches_the_library(server, models, model, n_rows):
    rows = request_rows(np.random.default_rng(2), n_rows)
    client = grpcclient.InferenceServerClient(server.grpc_address)
    tensor = grpcclient.InferInput("x", list(rows.shape), "FP64")
    tensor.set_data_from_numpy(rows)
    result = client.infer(
        model, [tensor], outputs=[grpcclient.InferRequestedOutput("predict_proba")]
    )
    expected = models[1][model](rows)
    got = result.as_numpy("predict_proba")
    if model == "hgb":
        assert np.array_equal(got, expected)
    else:  # LightGBM's sigmoid against numpy's: the last bit may differ
        np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_hist_gradient_boosting_labels_match_on_a_raw_grpc_batch(server, models):
    import joblib

    hgb = joblib.load(Path(models[0]) / "hgb" / "model.joblib")
    rows = request_rows(np.random.default_rng(3), 300)
    client = grpcclient.InferenceServerClient(server.grpc_address)
    tensor = grpcclient.InferInput("x", list(rows.shape), "FP64")
    tensor.set_data_from_numpy(rows)
    result = client.infer("hgb", [tensor], outputs=[grpcclient.InferRequestedOutput("predict")])
    assert np.array_equal(result.as_numpy("predict").astype(str), hgb.predict(rows))
