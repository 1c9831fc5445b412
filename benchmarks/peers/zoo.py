"""The benchmark models as the BentoML, LitServe and Ray Serve peers load them.

Copied beside each peer's service file into the run's folder and imported from there, in
the peer's own virtualenv: it imports nothing from this project, only the standard library,
numpy and the model's library. ``peer.json`` (written by ``benchmarks/native_peers.py``)
names each model's library and artefact; every predict runs on one thread, as the KServe
peer's and the libraries' own servers do by default.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Predict = Callable[[np.ndarray], np.ndarray]
CONFIG = "peer.json"


def _sklearn(path: str) -> Predict:
    import joblib

    return joblib.load(path).predict  # labels, as MLServer's and KServe's sklearn servers


def _lightgbm(path: str) -> Predict:
    import lightgbm

    booster = lightgbm.Booster(model_file=path)
    return lambda x: booster.predict(x, num_threads=1)


def _xgboost(path: str) -> Predict:
    import xgboost

    booster = xgboost.Booster(model_file=path)
    booster.set_param({"nthread": 1})
    return lambda x: booster.predict(xgboost.DMatrix(x, nthread=1))


LOADERS: dict[str, Callable[[str], Predict]] = {
    "sklearn": _sklearn,
    "lightgbm": _lightgbm,
    "xgboost": _xgboost,
}


def settings(folder: Path | None = None) -> dict[str, Any]:
    """The peer's ``peer.json`` (beside this file unless ``folder`` is given)."""
    return json.loads(((folder or Path(__file__).parent) / CONFIG).read_text())


def load(folder: Path | None = None) -> dict[str, Predict]:
    """Every model ``peer.json`` names, loaded: name -> predict on a float32 matrix."""
    models = settings(folder)["models"]
    return {name: LOADERS[m["library"]](m["path"]) for name, m in models.items()}


def answer(models: dict[str, Predict], request: dict[str, Any]) -> list[Any]:
    """The predictions for a native request ``{"model": NAME, "input": [[...], ...]}`` as
    a JSON-ready list (KeyError for an unknown model)."""
    rows = np.asarray(request["input"], dtype=np.float32)
    return np.asarray(models[request["model"]](rows)).tolist()
