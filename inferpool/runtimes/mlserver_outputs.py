"""MLServer 1.7.1's answers, for models whose settings name an MLServer runtime.

A model-settings file that says ``"implementation": "mlserver_lightgbm.LightGBMModel"``
(or ``mlserver_sklearn.SKLearnModel``, ``mlserver_xgboost.XGBoostModel``,
``mlserver_mlflow.MLflowRuntime``) was written for MLServer, whose clients read MLServer's
outputs: a LightGBM booster answers ``Booster.predict`` (probabilities, not labels), an
output of one value per row has the shape ``[N, 1]``, and each runtime finds its own
artefact names. This module holds what the four runtimes share for that "MLServer
flavour"; each runtime decides with ``mlserver_flavour`` once, at load, so a model
without those strings keeps inferpool's own answers and pays nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from inferpool.errors import ModelLoadError
from inferpool.runtimes.registry import RUNTIMES
from inferpool.settings import ModelSettings

# The artefact names each MLServer runtime looks for in a folder, in its order.
ARTEFACT_NAMES: dict[str, tuple[str, ...]] = {
    "lightgbm": ("model.bst",),
    "xgboost": ("model.bst", "model.json", "model.ubj"),
    "sklearn": ("model.joblib", "model.pickle", "model.pkl"),
    "catboost": ("model.cbm", "model.bin"),
}
# MLServer's name of the output of a pyfunc model that returns one array.
MLFLOW_ARRAY_OUTPUT = "output-1"


def mlserver_flavour(settings: ModelSettings, runtime: str) -> bool:
    """Whether the model's settings name MLServer's implementation of ``runtime`` (and no
    inferpool runtime, which would take precedence)."""
    entry = RUNTIMES.get(runtime)
    return entry is not None and not settings.runtime and entry.named_by(settings.implementation)


def find_mlserver_artefact(settings: ModelSettings, runtime: str) -> Path:
    """The file MLServer's runtime loads: ``parameters.uri`` when it names a file, else
    the first of the runtime's well-known names in that folder (the model's own folder
    without a uri). MLServer would then try the folder itself and fail; this says why."""
    folder = settings.resolve(settings.parameters.uri) if settings.parameters.uri else None
    folder = folder or settings.folder
    if folder is None:
        raise ModelLoadError(f"model '{settings.name}' names no uri and has no folder")
    if folder.is_file():
        return folder
    names = ARTEFACT_NAMES[runtime]
    implementation = RUNTIMES[runtime].mlserver
    if not folder.is_dir():
        raise ModelLoadError(f"model file {folder} does not exist")
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise ModelLoadError(
        f"{implementation} loads {' or '.join(names)} from {folder} and there is none; "
        "name the file in parameters.uri"
    )


def refuse_pickle(settings: ModelSettings, path: Path, library: str) -> None:
    """MLServer's LightGBM and XGBoost runtimes read their library's own model files; a
    pickled model is served by ``mlserver_sklearn.SKLearnModel`` (or inferpool's runtime)."""
    if path.suffix in (".joblib", ".pkl", ".pickle"):
        raise ModelLoadError(
            f"{settings.implementation} loads {library} model files, not the pickle "
            f"{path.name}: use mlserver_sklearn.SKLearnModel or the runtime "
            f"'{library.lower()}'"
        )


def as_output(value: Any) -> np.ndarray:
    """A value as MLServer's NumPy codec sends it: one value per row becomes ``[N, 1]``
    (a scalar ``[1]``) and text becomes BYTES (UTF-8)."""
    array = np.asarray(value)
    if array.ndim < 2:
        array = array.reshape(-1, 1) if array.ndim == 1 else array.reshape(1)
    if array.dtype.kind == "U" or (array.dtype.kind == "O" and _has_text(array)):
        encoded = [item.encode() if isinstance(item, str) else item for item in array.flat]
        array = np.array(encoded, dtype=object).reshape(array.shape)
    return array


def _has_text(array: np.ndarray) -> bool:
    return any(isinstance(item, str) for item in array.flat)


def frame_outputs(frame: Any) -> dict[str, np.ndarray]:
    """A DataFrame as MLServer's pandas codec sends it: one ``[N, 1]`` output per column."""
    return {str(column): as_output(frame[column].to_numpy()) for column in frame.columns}
