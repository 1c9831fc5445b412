"""The KServe peer: the benchmark models served by the ``kserve`` SDK's ``ModelServer``.

Runs inside KServe's own virtualenv (``benchmarks/kserve_env.py``), so it imports nothing
from this project: the standard library, kserve, numpy and the model's own library.

    python kserve_peer.py --model_dir REPO --model iris --model lightgbm \\
        --http_port 8080 --grpc_port 8081 --workers 1

Each ``--model`` is a folder of the harness's repository: its ``model-settings.json`` names
the artefact (``parameters.uri``) and MLServer's implementation, which picks the library
here. The model classes are ``kserve.Model`` subclasses written the way KServe's own
sklearnserver, lgbserver and xgbserver are: ``load`` reads the artefact, a synchronous
``predict`` takes the V2 ``InferRequest`` (REST or gRPC, decoded by KServe), predicts with
the library (one thread, like those servers' ``nthread`` default) and returns an
``InferResponse``. Every other argument is KServe's own (``--workers``, ``--max_threads``,
``--enable_latency_logging`` ...), parsed by ``kserve.model_server.parser``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer, model_server
from kserve.utils.numpy_codec import from_np_dtype
from kserve.utils.utils import generate_uuid


class LibraryModel(Model):
    """One benchmark model: ``load`` reads the artefact with its library, ``predict`` turns
    the V2 request's first input into a numpy array, predicts and answers ``output-0``.

    Subclasses say how to read and predict. They keep no lambdas: with ``--workers`` > 1,
    KServe pickles the models into each uvicorn process it spawns.
    """

    def __init__(self, name: str, artefact: Path) -> None:
        super().__init__(name)
        self.artefact = artefact
        self.model: Any = None

    def read(self, path: Path) -> Any:
        raise NotImplementedError

    def infer(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def load(self) -> bool:
        self.model = self.read(self.artefact)
        self.ready = True
        return self.ready

    def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None
    ) -> InferResponse:
        if self.model is None:
            raise RuntimeError(f"model {self.name} is not loaded")
        if not isinstance(payload, InferRequest):
            raise TypeError(f"model {self.name} takes V2 requests, not {type(payload).__name__}")
        result = np.asarray(self.infer(payload.inputs[0].as_numpy()))
        output = InferOutput(
            name="output-0", shape=list(result.shape), datatype=from_np_dtype(result.dtype)
        )
        output.set_data_from_numpy(result, binary_data=payload.use_binary_outputs)
        return InferResponse(
            response_id=payload.id or generate_uuid(),
            model_name=self.name,
            infer_outputs=[output],
            use_binary_outputs=payload.use_binary_outputs,
        )


class SKLearnModel(LibraryModel):
    """A joblib pickle of a scikit-learn estimator; ``predict`` (labels), as sklearnserver."""

    def read(self, path: Path) -> Any:
        import joblib

        return joblib.load(path)

    def infer(self, x: np.ndarray) -> np.ndarray:
        return self.model.predict(x)


class LightGBMModel(LibraryModel):
    """A LightGBM booster's text file, predicted on one thread."""

    def read(self, path: Path) -> Any:
        import lightgbm

        return lightgbm.Booster(model_file=str(path))

    def infer(self, x: np.ndarray) -> np.ndarray:
        return self.model.predict(x, num_threads=1)


class XGBoostModel(LibraryModel):
    """An XGBoost booster's JSON file, predicted on one thread."""

    def read(self, path: Path) -> Any:
        import xgboost

        booster = xgboost.Booster(model_file=str(path))
        booster.set_param({"nthread": 1})
        return booster

    def infer(self, x: np.ndarray) -> np.ndarray:
        import xgboost

        return self.model.predict(xgboost.DMatrix(x, nthread=1))


# MLServer's implementation (model-settings.json) -> the class that serves the artefact.
CLASSES: dict[str, type[LibraryModel]] = {
    "mlserver_sklearn.SKLearnModel": SKLearnModel,
    "mlserver_lightgbm.LightGBMModel": LightGBMModel,
    "mlserver_xgboost.XGBoostModel": XGBoostModel,
}


def model_from_folder(folder: Path) -> LibraryModel:
    """The model a repository folder describes (ValueError when it cannot be served)."""
    settings_file = folder / "model-settings.json"
    if not settings_file.is_file():
        raise ValueError(f"{folder} has no model-settings.json")
    settings = json.loads(settings_file.read_text())
    implementation = settings.get("implementation")
    cls = CLASSES.get(implementation)
    if cls is None:
        raise ValueError(
            f"{settings_file}: implementation {implementation!r} is not one of {sorted(CLASSES)}"
        )
    uri = (settings.get("parameters") or {}).get("uri")
    if not uri:
        raise ValueError(f"{settings_file} names no parameters.uri")
    return cls(settings.get("name") or folder.name, (folder / uri).resolve())


def main() -> None:
    parser = argparse.ArgumentParser(parents=[model_server.parser], description=__doc__)
    parser.add_argument("--model_dir", type=Path, required=True, help="model repository")
    parser.add_argument(
        "--model", action="append", required=True, help="a folder of --model_dir (repeatable)"
    )
    args, _ = parser.parse_known_args()
    models = [model_from_folder(args.model_dir / name) for name in args.model]
    for model in models:
        model.load()
    # ModelServer reads the rest of the command line itself (kserve.model_server.args).
    ModelServer().start(models)


if __name__ == "__main__":
    main()
