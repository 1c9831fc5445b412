"""Test helpers for the runtimes: small models trained here (fixed seeds) and saved in
every artefact format a runtime recognises, a model folder loaded and run through the
engine's inference path in-process, and model folders of the echo runtime."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from inferpool.codecs.registry import decode_output
from inferpool.engine.worker import inference
from inferpool.engine.worker.model import LoadedModel, load_model
from inferpool.protocol.datatypes import datatype_of
from inferpool.protocol.types import InferenceRequest, RequestedOutput, Tensor
from inferpool.runtimes.base import Runtime
from inferpool.settings import ModelSettings, read_model_settings

N_FEATURES = 8


class RowSums(Runtime):
    """Sums each row, recording the rows of each call; refuses negative values the way a
    library's input check would (a ValueError)."""

    def load(self) -> None:
        self.calls: list[int] = []

    def predict(self, payload: Any, outputs: list[str]) -> dict[str, Any]:
        self.calls.append(len(payload))
        if (payload < 0).any():
            raise ValueError("Input contains negative values.")
        return {outputs[0]: payload.sum(axis=1)}


def classification_data(n_classes: int = 3, rows: int = 300):
    from sklearn.datasets import make_classification

    X, y = make_classification(
        rows, N_FEATURES, n_informative=5, n_classes=n_classes, random_state=0
    )
    return X, y


def regression_data(rows: int = 300):
    from sklearn.datasets import make_regression

    X, y = make_regression(rows, N_FEATURES, noise=0.5, random_state=0)
    return X, y


def lightgbm_estimator(kind: str, n_classes: int = 3, **fit_kwargs):
    """A fitted LGBMClassifier (kind="classifier") or LGBMRegressor; 10 trees, 1 thread."""
    import lightgbm

    params = {"n_estimators": 10, "num_leaves": 7, "n_jobs": 1, "verbose": -1, "random_state": 0}
    if kind == "classifier":
        X, y = classification_data(n_classes)
        return lightgbm.LGBMClassifier(**params).fit(X, y, **fit_kwargs), X
    X, y = regression_data()
    return lightgbm.LGBMRegressor(**params).fit(X, y, **fit_kwargs), X


def xgboost_estimator(kind: str, n_classes: int = 3, **params):
    """A fitted XGBClassifier (kind="classifier") or XGBRegressor; 10 trees, 1 thread."""
    import xgboost

    params = {"n_estimators": 10, "max_depth": 3, "n_jobs": 1, "random_state": 0, **params}
    if kind == "classifier":
        X, y = classification_data(n_classes)
        return xgboost.XGBClassifier(**params).fit(X, y), X
    X, y = regression_data()
    return xgboost.XGBRegressor(**params).fit(X, y), X


def save_pickle(folder: Path, model, filename: str = "model.joblib") -> Path:
    import joblib

    folder.mkdir(parents=True, exist_ok=True)
    joblib.dump(model, folder / filename)
    return folder


def save_booster(folder: Path, booster, filename: str) -> Path:
    """A LightGBM or XGBoost Booster in its own file format, under ``filename``."""
    folder.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(folder / filename))
    return folder


def rows_request(X: np.ndarray, outputs: list[str] | None = None, name: str = "input-0") -> dict:
    """A V2 REST request with the rows of X as one FP64 tensor."""
    body: dict = {
        "inputs": [
            {"name": name, "shape": list(X.shape), "datatype": "FP64", "data": X.ravel().tolist()}
        ]
    }
    if outputs:
        body["outputs"] = [{"name": output} for output in outputs]
    return body


def output_array(response: dict, name: str) -> np.ndarray:
    """One output of a V2 REST response as an array of its declared shape."""
    for output in response["outputs"]:
        if output["name"] == name:
            return np.asarray(output["data"]).reshape(output["shape"])
    raise KeyError(f"no output {name!r} in {[o['name'] for o in response['outputs']]}")


def loaded_sums_model(
    runtime_class: type[Runtime], max_batch_size: int = 8, max_batch_time: float = 0.05
) -> LoadedModel:
    """Model 'sums' (input x: FP64 [-1, 2], output sum: FP64 [-1]) on ``runtime_class``,
    loaded in this process (for tests of the worker path and of batching)."""
    settings = ModelSettings(
        name="sums",
        max_batch_size=max_batch_size,
        max_batch_time=max_batch_time,
        inputs=[{"name": "x", "datatype": "FP64", "shape": [-1, 2]}],
        outputs=[{"name": "sum", "datatype": "FP64", "shape": [-1]}],
    )
    runtime = runtime_class(settings)
    runtime.load()
    return LoadedModel(settings, runtime)


def load(folder: Path) -> LoadedModel:
    return load_model(read_model_settings(folder, folder.name))


def infer(model: LoadedModel, X: np.ndarray, outputs: list[str] | None = None) -> dict:
    """The outputs (name → array of the response's shape) for rows X as one input."""
    X = np.asarray(X)
    request = InferenceRequest(
        [Tensor("input-0", datatype_of(X), X.shape, X)],
        outputs=[RequestedOutput(name) for name in outputs or []],
    )
    response = inference.infer(model, request)
    # Decoded as a client would: by each output's content type (BYTES labels → str).
    return {t.name: np.asarray(decode_output(t)).reshape(t.shape) for t in response.outputs}


ECHO_SOURCE = Path(__file__).with_name("echo_model.py")


def write_echo_model(
    root: Path,
    name: str,
    outputs: list[dict] | None = None,
    inputs: list[dict] | None = None,
    **extra: Any,
) -> Path:
    """A model folder ``root/name`` running ``echo_model.EchoRuntime`` (a copy of
    tests/support/echo_model.py) with ``extra`` as its ``parameters.extra``."""
    folder = root / name
    folder.mkdir(parents=True)
    shutil.copy(ECHO_SOURCE, folder / "echo_model.py")
    settings: dict[str, Any] = {
        "name": name,
        "implementation": "echo_model.EchoRuntime",
        "parameters": {"extra": extra},
    }
    if outputs is not None:
        settings["outputs"] = outputs
    if inputs is not None:
        settings["inputs"] = inputs
    (folder / "model-settings.json").write_text(json.dumps(settings))
    return folder


def write_constant_model(folder: Path, label: int, filename: str = "model.joblib") -> Path:
    """An iris classifier answering ``label`` for every row in ``folder``: which version
    of a model answered shows in its predictions."""
    from sklearn.datasets import load_iris
    from sklearn.dummy import DummyClassifier

    X, y = load_iris(return_X_y=True)
    classifier = DummyClassifier(strategy="constant", constant=label).fit(X, y)
    return save_pickle(folder, classifier, filename)
