"""MLServer 1.7.1's documentation examples that need a repository of their own (its
``docs/examples/<name>``): mms and model-repository (the sklearn and xgboost models of
``examples.py`` again, under the same names and versions but laid out as those examples
lay them out: ``models/<name>/``, no ``uri``, the runtimes' default file names), streaming
(the README's word-by-word text runtime, ``predict_stream`` over the client's stream) and,
when MLServer's MLflow runtime is installed, mlflow (an ElasticNet saved in the MLflow
format under an ``mlruns/`` folder beside ``src/``, as the example's training leaves it),
and when numpyro is installed, custom (numpyro's Bayesian regression).

Facts carry over from the examples (settings, names, requests, what is trained); the
training data is made here (tests download nothing) and the runtime is written here from
the README's description. ``tests/mlserver/test_examples_second_installed.py`` serves the
repository with inferpool and with ``mlserver start`` side by side.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path

import numpy as np

from tests.mlserver.examples import _mushrooms, _settings

# streaming (docs/examples/streaming): the one request's text split at spaces, each word
# answered on its own (the words after the first keep their leading space), a pause
# before each to stand for a slow model (the README's is 0.5 s; shorter here).
TEXT_MODEL = """
import asyncio
from typing import AsyncIterator

from mlserver import MLModel
from mlserver.codecs import StringCodec
from mlserver.types import InferenceRequest, InferenceResponse


class TextModel(MLModel):
    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        requests = [request async for request in payloads]
        text = StringCodec.decode_input(requests[0].inputs[0])[0]
        words = text.split(" ")
        for position, word in enumerate(words):
            await asyncio.sleep(0.05)
            piece = word if position == 0 else " " + word
            output = StringCodec.encode_output(name="output", payload=[piece], use_bytes=True)
            yield InferenceResponse(model_name=self._settings.name, outputs=[output])
"""

TEXT_SETTINGS = {
    "name": "text-model",
    "implementation": "text_model.TextModel",
    "versions": ["text-model/v1.2.3"],
    "platform": "mlserver",
    "inputs": [{"datatype": "BYTES", "name": "prompt", "shape": [1]}],
    "outputs": [{"datatype": "BYTES", "name": "output", "shape": [1]}],
}

# custom (docs/examples/custom): a runtime that loads the posterior samples saved as JSON
# (``get_model_uri``), and predicts with numpyro's ``Predictive`` over the README's
# Bayesian regression (intercept, optional slopes for marriage and age, a noise scale),
# seeded with PRNGKey(0), answering the mean of the predicted ``obs``; ``decode_args``
# gives its optional arrays.
NUMPYRO_MODEL = """
import json
from typing import Optional

import numpy as np
import numpyro
from jax import random
from mlserver import MLModel
from mlserver.codecs import decode_args
from mlserver.utils import get_model_uri
from numpyro import distributions as dist
from numpyro.infer import Predictive


def regression(marriage=None, age=None, divorce=None):
    intercept = numpyro.sample("a", dist.Normal(0.0, 0.2))
    mean = intercept
    if marriage is not None:
        mean = mean + numpyro.sample("bM", dist.Normal(0.0, 0.5)) * marriage
    if age is not None:
        mean = mean + numpyro.sample("bA", dist.Normal(0.0, 0.5)) * age
    sigma = numpyro.sample("sigma", dist.Exponential(1.0))
    numpyro.sample("obs", dist.Normal(mean, sigma), obs=divorce)


class NumpyroModel(MLModel):
    async def load(self) -> bool:
        with open(await get_model_uri(self._settings)) as model_file:
            samples = {key: np.array(value) for key, value in json.load(model_file).items()}
        self._predictive = Predictive(regression, samples)
        return True

    @decode_args
    async def predict(
        self,
        marriage: Optional[np.ndarray] = None,
        age: Optional[np.ndarray] = None,
        divorce: Optional[np.ndarray] = None,
    ) -> np.ndarray:
        predicted = self._predictive(
            rng_key=random.PRNGKey(0), marriage=marriage, age=age, divorce=divorce
        )
        return np.asarray(predicted["obs"].mean())
"""

WINE_COLUMNS = [
    "fixed acidity",
    "volatile acidity",
    "citric acid",
    "residual sugar",
    "chlorides",
    "free sulfur dioxide",
    "total sulfur dioxide",
    "density",
    "pH",
    "sulphates",
    "alcohol",
]
# The mlflow README's wine (its request, and its /invocations dataframe_split row).
WINE = [7.4, 0.7, 0, 1.9, 0.076, 11, 34, 0.9978, 3.51, 0.56, 9.4]


def numpyro_installed() -> bool:
    """numpyro and jax, for the custom example."""
    return all(importlib.util.find_spec(name) for name in ("numpyro", "jax"))


def _numpyro(folder: Path) -> None:
    """custom's model: the posterior of the regression of divorce on marriage rate (both
    standardised) approximated with NUTS, its samples saved as ``numpyro-divorce.json``.
    The 50 states' rates are made here (the README downloads them); fewer warm-up steps
    and samples than the README's 1000 and 2000, to keep the run short."""
    import jax
    from numpyro.infer import MCMC, NUTS

    namespace: dict = {}
    exec(compile(NUMPYRO_MODEL, "numpyro_model", "exec"), namespace)  # its model function
    rng = np.random.default_rng(0)
    marriage = rng.normal(size=50)
    divorce = 0.35 * marriage + rng.normal(size=50) * 0.9
    mcmc = MCMC(NUTS(namespace["regression"]), num_warmup=100, num_samples=200, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), marriage=marriage, divorce=divorce)
    samples = {key: np.asarray(value).tolist() for key, value in mcmc.get_samples().items()}
    settings = {
        "name": "numpyro-divorce",
        "implementation": "models.NumpyroModel",
        "parameters": {"uri": "./numpyro-divorce.json"},
    }
    _settings(folder, settings)
    (folder / "models.py").write_text(NUMPYRO_MODEL)
    (folder / "numpyro-divorce.json").write_text(json.dumps(samples))


def mlflow_installed() -> bool:
    """MLServer's MLflow runtime and the full ``mlflow`` package (not mlflow-skinny)."""
    return all(importlib.util.find_spec(name) for name in ("mlserver_mlflow", "mlflow.server"))


def _mms_models(models: Path) -> tuple[list[float], list[float]]:
    """mms's two models: the SVC on the first half of the digits (``model.joblib``) and
    a booster trained with ``xgb.train`` (binary:logistic, depth 2, eta 1, 2 rounds) on
    mushroom-like data (``model.json``); the first test row of each."""
    import joblib
    import xgboost
    from sklearn import datasets, svm

    digits = datasets.load_digits()
    data = digits.images.reshape((len(digits.images), -1))
    half = len(data) // 2
    classifier = svm.SVC(gamma=0.001).fit(data[:half], digits.target[:half])
    for name, runtime in (
        ("mnist-svm", "mlserver_sklearn.SKLearnModel"),
        ("mushroom-xgboost", "mlserver_xgboost.XGBoostModel"),
    ):
        settings = {"name": name, "implementation": runtime, "parameters": {"version": "v0.1.0"}}
        _settings(models / name, settings)
    joblib.dump(classifier, models / "mnist-svm" / "model.joblib")
    x, y = _mushrooms()
    parameters = {"max_depth": 2, "eta": 1, "objective": "binary:logistic"}
    booster = xgboost.train(parameters, xgboost.DMatrix(x[:300], label=y[:300]), 2)
    booster.save_model(models / "mushroom-xgboost" / "model.json")
    return data[half].tolist(), x[300].tolist()


def _wine(folder: Path) -> None:
    """mlflow's model: an ElasticNet (alpha 0.5, l1_ratio 0.5) on wine-like data with the
    example's eleven columns, saved in the MLflow format with the signature inferred from
    its training frames, under ``mlruns/0/<run>/artifacts/model`` as the example's
    training leaves it; ``src/`` beside it holds the training's source, as in the
    example: neither folder is a model."""
    import mlflow.sklearn
    import pandas as pd
    from mlflow.models.signature import infer_signature
    from sklearn.linear_model import ElasticNet

    rng = np.random.default_rng(40)
    scale = np.abs(np.array(WINE, dtype=float)) * 0.2 + 0.01
    train_x = pd.DataFrame(WINE + rng.normal(size=(300, 11)) * scale, columns=WINE_COLUMNS)
    weights = rng.normal(size=11) / scale
    quality = 5.6 + 0.05 * (train_x.to_numpy() - WINE) @ weights + rng.normal(size=300) * 0.3
    train_y = pd.DataFrame({"quality": quality})
    model = ElasticNet(alpha=0.5, l1_ratio=0.5, random_state=42).fit(train_x, train_y)
    run = "mlruns/0/6cd26d62883641188b4f7616725ed838/artifacts/model"
    signature = infer_signature(train_x, train_y)
    mlflow.sklearn.save_model(model, str(folder / run), signature=signature)
    (folder / "src").mkdir()
    (folder / "src" / "train.py").write_text(inspect.getsource(_wine))
    settings = {
        "name": "wine-classifier",
        "implementation": "mlserver_mlflow.MLflowRuntime",
        "parameters": {"uri": f"./{run}"},
    }
    _settings(folder, settings)


def wine_request() -> dict:
    """The mlflow README's request: one FP32 ``[1]`` input per column."""
    inputs = [
        {"name": name, "shape": [1], "datatype": "FP32", "data": [value]}
        for name, value in zip(WINE_COLUMNS, WINE, strict=True)
    ]
    return {"inputs": inputs}


def _rows(row: list[float]) -> dict:
    """mms's request: the first test row as the README sends it (``x_0.tolist()``)."""
    return {
        "inputs": [{"name": "predict", "shape": [1, len(row)], "datatype": "FP32", "data": [row]}]
    }


def write_second(root: Path, with_mlflow: bool, with_numpyro: bool) -> dict[str, tuple[str, dict]]:
    """The second repository in ``root``: each example's name, its infer path and request.

    ``settings.json`` joins mms's (``debug``) and streaming's (no parallel workers, no
    gzip: MLServer streams neither through workers nor through its gzip middleware)."""
    settings = {"debug": "true", "parallel_workers": 0, "gzip_enabled": False}
    root.mkdir(parents=True, exist_ok=True)
    (root / "settings.json").write_text(json.dumps(settings, indent=4))
    digit, mushroom = _mms_models(root / "models")
    _settings(root / "text-model", TEXT_SETTINGS)
    (root / "text-model" / "text_model.py").write_text(TEXT_MODEL)
    cases = {
        "mms-sklearn": ("/v2/models/mnist-svm/versions/v0.1.0/infer", _rows(digit)),
        "mms-xgboost": ("/v2/models/mushroom-xgboost/versions/v0.1.0/infer", _rows(mushroom)),
    }
    if with_mlflow:
        _wine(root / "mlflow")
        cases["mlflow"] = ("/v2/models/wine-classifier/infer", wine_request())
    if with_numpyro:
        _numpyro(root / "custom")
        # The README's request: NumpyCodec.encode_input("marriage", np.array([28.0])).
        marriage = {"name": "marriage", "shape": [1], "datatype": "FP64", "data": [28.0]}
        marriage["parameters"] = {"content_type": "np"}
        cases["custom"] = ("/v2/models/numpyro-divorce/infer", {"inputs": [marriage]})
    return cases
