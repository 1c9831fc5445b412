"""The tree kernel in a real server: LightGBM, XGBoost and random-forest models report which
predictor serves them, and answer over REST and raw gRPC exactly as their library does,
for rows with NaN and zeros too; ``tree_kernel: false`` keeps a model on its library."""

from __future__ import annotations

import json
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


def training_rows(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    X = rng.normal(size=(500, N_FEATURES))
    y = np.digitize(X[:, 0] - X[:, 1] + X[:, 2] ** 2, [-0.5, 1.0])
    return X, y


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    import lightgbm
    import xgboost
    from sklearn.ensemble import RandomForestClassifier

    root = tmp_path_factory.mktemp("kernel")
    rng = np.random.default_rng(0)
    X, y = training_rows(rng)
    with_nan = X.copy()
    with_nan[rng.random(X.shape) < 0.1] = np.nan  # missing type NaN on every feature
    booster = lightgbm.train(
        {"objective": "binary", "num_leaves": 15, "verbose": -1, "num_threads": 1},
        lightgbm.Dataset(with_nan, (y > 0).astype(int)),
        num_boost_round=30,
    )
    multi = lightgbm.LGBMClassifier(n_estimators=20, num_leaves=7, n_jobs=1, verbose=-1)
    multi.fit(X, y)
    forest = RandomForestClassifier(n_estimators=30, max_depth=10, random_state=0)
    forest.fit(X, LABELS[y])
    xgb = xgboost.train(
        {"objective": "binary:logistic", "max_depth": 4, "nthread": 1},
        xgboost.DMatrix(with_nan, (y > 0).astype(int)),
        num_boost_round=30,
    )
    save_booster(root / "xgb-binary", xgb, "model.json")
    save_booster(root / "lgb-binary", booster, "model.txt")
    save_pickle(root / "lgb-multi", multi)
    save_pickle(root / "forest", forest)
    library = save_booster(root / "lgb-library", booster, "model.txt")
    (library / "model-settings.json").write_text(
        json.dumps({"parameters": {"extra": {"tree_kernel": False}}})
    )
    references = {
        "lgb-binary": lambda rows: booster.predict(rows),
        "lgb-library": lambda rows: booster.predict(rows),
        "lgb-multi": multi.predict_proba,
        "forest": forest.predict_proba,
        "xgb-binary": lambda rows: xgb.inplace_predict(rows),
    }
    return root, references


def probability_of(model: str, response_rows: np.ndarray) -> np.ndarray:
    """P(class 1) of a binary model, all classes of the others: as the reference gives."""
    binary = model in ("lgb-binary", "lgb-library", "xgb-binary")
    return response_rows[:, 1] if binary else response_rows


# XGBoost computes in float32: its link function's last bit may differ from numpy's.
TOLERANCE = {"xgb-binary": 1e-6}


def test_the_log_says_which_predictor_serves_each_model(server):
    log = server.output()
    for model in ("lgb-binary", "lgb-multi", "forest", "xgb-binary"):
        assert re.search(rf"model '{model}': .*predicted by the tree kernel \(\d+ trees", log), log
    assert re.search(r"model 'lgb-library': .*predicted by LightGBM \(tree_kernel is off\)", log)


@pytest.mark.parametrize(
    "model", ["lgb-binary", "lgb-multi", "forest", "lgb-library", "xgb-binary"]
)
def test_rest_answers_match_the_library(server, models, model):
    rows = np.random.default_rng(1).normal(size=(40, N_FEATURES))
    rows[::5, 3] = 0.0
    got = rest_output(server.url, model, rows)
    expected, tolerance = models[1][model](rows), TOLERANCE.get(model, 1e-12)
    np.testing.assert_allclose(probability_of(model, got), expected, rtol=tolerance)


@pytest.mark.parametrize("model", ["lgb-binary", "lgb-multi", "lgb-library", "xgb-binary"])
def test_raw_grpc_batch_with_nan_and_zeros_matches_the_library(server, models, model):
    rng = np.random.default_rng(2)
    rows = rng.normal(size=(256, N_FEATURES)).astype(np.float32)
    rows[rng.random(rows.shape) < 0.05] = np.nan
    rows[rng.random(rows.shape) < 0.05] = 0.0
    client = grpcclient.InferenceServerClient(server.grpc_address)
    tensor = grpcclient.InferInput("x", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    result = client.infer(
        model, [tensor], outputs=[grpcclient.InferRequestedOutput("predict_proba")]
    )
    got = result.as_numpy("predict_proba")
    expected, tolerance = models[1][model](rows), TOLERANCE.get(model, 1e-12)
    np.testing.assert_allclose(probability_of(model, got), expected, rtol=tolerance)


def test_the_forest_labels_match_scikit_learn_on_a_raw_grpc_batch(server, models):
    import joblib

    forest = joblib.load(Path(models[0]) / "forest" / "model.joblib")
    rows = np.random.default_rng(3).normal(size=(256, N_FEATURES)).astype(np.float32)
    client = grpcclient.InferenceServerClient(server.grpc_address)
    tensor = grpcclient.InferInput("x", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    result = client.infer("forest", [tensor], outputs=[grpcclient.InferRequestedOutput("predict")])
    labels = result.as_numpy("predict").astype(str)
    assert np.array_equal(labels, forest.predict(rows))
