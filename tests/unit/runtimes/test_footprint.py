"""A loaded model's footprint (runtimes/footprint.py): the same figure on every load and in
every process, near the memory the load really takes, and cheap to compute."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from inferpool.runtimes.footprint import model_footprint, object_bytes
from tests.support import write_custom_model
from tests.support.runtimes import load, save_booster

# A custom runtime holding 1 MiB of its own array and 4 KiB of "native" memory.
CUSTOM_RUNTIME = """
import numpy as np

from inferpool import Runtime


class Holder(Runtime):
    def load(self):
        self.table = np.arange(1 << 17, dtype=np.float64)

    def native_bytes(self):
        return 4096

    def predict(self, payload, outputs):
        return {outputs[0]: payload.sum(axis=1)}
"""
IO = {
    "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 2]}],
    "outputs": [{"name": "sum", "datatype": "FP64", "shape": [-1]}],
}

# Runs in a fresh interpreter: loads each folder once to import what its runtime imports
# lazily, then again measuring its RSS growth; prints {folder: [footprint, growth]}.
CHILD = """
import ctypes, gc, json, sys, warnings
from pathlib import Path
warnings.simplefilter("ignore")
from inferpool.runtimes.footprint import model_footprint
from tests.support.runtimes import load

libc = ctypes.CDLL("libc.so.6")

def rss():
    gc.collect()
    libc.malloc_trim(0)  # what the allocator kept from loading is not the model's
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon"))

figures = {}
for folder in map(Path, sys.argv[1:]):
    load(folder)
    before = rss()
    model = load(folder)
    figures[folder.name] = [model_footprint(model), rss() - before]
print(json.dumps(figures))
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import joblib
    import lightgbm
    import mlflow.sklearn
    import xgboost
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    root = tmp_path_factory.mktemp("footprint")
    rng = np.random.default_rng(0)
    X = rng.random((6000, 8))
    # Random labels of 16 classes grow deep trees: a ~22 MiB forest (nodes and values).
    labels = rng.integers(0, 16, len(X))
    forest = RandomForestClassifier(12, random_state=0, n_jobs=1).fit(X, labels)
    folders = {}
    for name, model in (
        ("forest", forest),
        ("logreg", LogisticRegression(max_iter=200).fit(X, labels % 2)),
    ):
        folders[name] = root / name
        folders[name].mkdir()
        joblib.dump(model, folders[name] / "model.joblib")
    # Random targets grow every tree to its 1023 leaves: ~6 MiB once served.
    booster = lightgbm.train(
        {"objective": "regression", "num_leaves": 1023, "min_data_in_leaf": 2, "verbose": -1}
        | {"num_threads": 1, "max_bin": 63},
        lightgbm.Dataset(X, rng.random(len(X))),
        num_boost_round=40,
    )
    folders["lightgbm"] = save_booster(root / "lightgbm", booster, "model.txt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xgb = xgboost.train(
            {"objective": "binary:logistic", "max_depth": 6, "nthread": 1},
            xgboost.DMatrix(X, labels % 2),
            num_boost_round=20,
        )
        folders["xgboost"] = save_booster(root / "xgboost", xgb, "model.json")
        folders["mlflow"] = root / "mlflow"
        mlflow.sklearn.save_model(
            RandomForestClassifier(5, random_state=0, n_jobs=1).fit(X, labels % 2),
            str(folders["mlflow"]),
            pip_requirements=[],
            serialization_format=mlflow.sklearn.SERIALIZATION_FORMAT_CLOUDPICKLE,
        )
    folders["custom"] = write_custom_model(root / "custom", CUSTOM_RUNTIME, "Holder", **IO)
    return folders


@pytest.fixture(scope="module")
def in_process(models: dict[str, Path]) -> dict[str, list[int]]:
    """Each model's footprint on three loads in this process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLflow's advice on a model without a signature
        return {name: [model_footprint(load(f)) for _ in range(3)] for name, f in models.items()}


@pytest.fixture(scope="module")
def in_child(models: dict[str, Path]) -> dict[str, list[int]]:
    """[footprint, RSS growth] of each model, measured in a fresh process."""
    # One native thread, as in a worker: the stacks and arenas of the threads a library
    # (or the tree kernel, for the load's large probe batch) starts stay in RSS, cached by
    # glibc, and would be counted as the model's.
    child = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, models.values())],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[3],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert child.returncode == 0, child.stderr
    figures: dict[str, list[int]] = json.loads(child.stdout)
    return figures


def test_the_same_figure_on_every_load(in_process) -> None:
    for name, figures in in_process.items():
        assert len(set(figures)) == 1, (name, figures)


# A fresh interpreter importing every library and loading every model: slow.
@pytest.mark.slow
def test_the_same_figure_in_another_process(in_process, in_child) -> None:
    for name, figures in in_process.items():
        assert in_child[name][0] == figures[0], name


@pytest.mark.slow
@pytest.mark.parametrize("name", ["forest", "lightgbm"])
def test_a_big_model_is_within_a_fifth_of_the_memory_its_load_takes(in_child, name: str) -> None:
    footprint, growth = in_child[name]
    assert growth > 4 << 20  # big enough for RSS to measure it
    assert 0.8 <= footprint / growth <= 1.2, (name, footprint, growth)


def test_small_and_custom_models_count_what_they_hold(in_process) -> None:
    assert in_process["logreg"][0] < 64 << 10  # a few coefficient arrays
    # The custom runtime's array, its native bytes, and little else.
    held = (1 << 17) * 8 + 4096
    assert held < in_process["custom"][0] < held + (64 << 10)
    assert in_process["xgboost"][0] > 0 and in_process["mlflow"][0] > 0


def test_a_big_forest_is_walked_fast(models: dict[str, Path]) -> None:
    import time

    model = load(models["forest"])
    start = time.process_time()  # CPU time: the machine's other load does not count
    model_footprint(model)
    assert time.process_time() - start < 0.05


def test_shared_and_repeated_objects_count_once() -> None:
    data = np.ones(1 << 16)  # 512 KiB
    view = data[10:]
    alone = object_bytes([data])
    assert object_bytes([data, data, view]) - alone < 1024  # the view's header only
    assert object_bytes([view]) > data.nbytes  # a view holds its base's buffer
    assert object_bytes(["model", None, True, 7, ()]) == object_bytes([None, None, None, 7, ()])
    # A logger leads to every logger of the process: the interpreter's, not the model's.
    assert object_bytes([logging.getLogger("inferpool")]) == object_bytes([None])
