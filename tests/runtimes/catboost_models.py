"""CatBoost models trained on the fly for the CatBoost runtime's tests, and the folders
that serve them: plain folders (``model.cbm``) and MLServer's layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# Small and quick: the tests compare answers, not accuracy; no catboost_info/ written in
# the working directory (the checkout).
TRAINING = {
    "iterations": 8,
    "depth": 3,
    "verbose": False,
    "thread_count": 1,
    "random_seed": 0,
    "allow_writing_files": False,
}
COLOURS = np.array(["red", "green", "blue"])


def _fit(kind: str, data: Any, labels: Any, **options: Any) -> Any:
    import catboost

    estimator = {"classifier": catboost.CatBoostClassifier, "regressor": catboost.CatBoostRegressor}
    model = estimator[kind](**{**TRAINING, **options})
    return model.fit(data, labels)


def numeric_rows(rows: int, features: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, features)).round(3)


def binary_classifier() -> Any:
    """MLServer's example: 10 integer features, labels 0/1."""
    rng = np.random.default_rng(1)
    data = rng.integers(0, 100, size=(100, 10))
    return _fit("classifier", data, rng.integers(0, 2, size=100), loss_function="Logloss")


def regressor(loss: str = "RMSE") -> Any:
    data = numeric_rows(120, 4)
    target = data @ np.array([1.0, -2.0, 0.5, 3.0])
    if loss == "Poisson":
        target = np.random.default_rng(2).poisson(np.exp(0.3 * data[:, 0]))
    return _fit("regressor", data, target, loss_function=loss)


def multiclass_classifier() -> Any:
    """Three classes labelled by strings."""
    data = numeric_rows(150, 4)
    labels = np.array(["a", "b", "c"])[np.argmax(data[:, :3], axis=1)]
    return _fit("classifier", data, labels, loss_function="MultiClass")


def rows_with_nan(rows: int, features: int, seed: int = 0) -> np.ndarray:
    """Normal rows with one value in ten NaN."""
    rng = np.random.default_rng(seed)
    data = rng.normal(size=(rows, features))
    data[rng.random(data.shape) < 0.1] = np.nan
    return data


def nan_classifier(loss: str = "MultiClass", nan_mode: str = "Min", **options: Any) -> Any:
    """Trained on rows with NaN (``nan_mode`` Max: a NaN is above every border), deeper
    and longer than the others, on 6 features; three classes (Logloss: two)."""
    data = rows_with_nan(300, 6, seed=5)
    labels = np.argmax(np.nan_to_num(data[:, :3]), axis=1)
    if loss in ("Logloss", "CrossEntropy"):
        labels = (labels > 0).astype(int)
    options = {"iterations": 30, "depth": 6, **options}
    return _fit("classifier", data, labels, loss_function=loss, nan_mode=nan_mode, **options)


def categorical_frame(rows: int, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "num": rng.normal(size=rows).round(3),
            "colour": rng.choice(COLOURS, rows),
            "size": rng.integers(0, 3, rows),
        }
    )


def categorical_classifier() -> Any:
    """Categorical features named (``colour``, ``size``) in a DataFrame."""
    frame = categorical_frame(200)
    labels = ((frame.colour == "red") ^ (frame["size"] == 2)).astype(int)
    return _fit("classifier", frame, labels, cat_features=["colour", "size"])


def categorical_by_index() -> Any:
    """Categorical feature 1 given by index, trained on an object array (no names)."""
    frame = categorical_frame(200, seed=4)
    data = frame.to_numpy(dtype=object)
    return _fit("regressor", data, frame.num * 2 + (frame.colour == "blue"), cat_features=[1])


def save(model: Any, folder: Path, filename: str = "model.cbm", **settings: Any) -> Path:
    """``model`` saved in ``folder`` (and a ``model-settings.json`` of ``settings``)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_model(str(folder / filename))
    if settings:
        (folder / "model-settings.json").write_text(json.dumps(settings))
    return folder / filename


def write_catboost_info(folder: Path) -> None:
    """What CatBoost's training writes in its working directory (``train_dir``)."""
    info = folder / "catboost_info"
    (info / "learn").mkdir(parents=True, exist_ok=True)
    (info / "learn_error.tsv").write_text("iter\tLogloss\n0\t0.69\n")
    (info / "time_left.tsv").write_text("iter\tPassed\tRemaining\n0\t1\t0\n")
    (info / "catboost_training.json").write_text('{"meta": {}}')


def tensor(name: str, values: np.ndarray | list, datatype: str) -> dict[str, Any]:
    """A V2 input (REST document, flat data) of a 1-D or 2-D array."""
    array = np.asarray(values, dtype=object if datatype == "BYTES" else None)
    data = [str(v) for v in array.ravel()] if datatype == "BYTES" else array.ravel().tolist()
    return {"name": name, "shape": list(array.shape), "datatype": datatype, "data": data}


def frame_inputs(frame: pd.DataFrame, order: list[str] | None = None) -> list[dict[str, Any]]:
    """One input per column, text as BYTES, numbers as FP64 (or INT64 for integers)."""
    inputs = []
    for name in order or list(frame.columns):
        column = frame[name].to_numpy()
        kind = {"O": "BYTES", "i": "INT64"}.get(column.dtype.kind, "FP64")
        inputs.append(tensor(name, column, kind))
    return inputs
