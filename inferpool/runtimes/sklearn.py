"""The scikit-learn runtime: any estimator or pipeline saved with joblib or pickle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import joblib
import numpy as np

from inferpool.errors import BadRequest
from inferpool.protocol.datatypes import datatype_of
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes.base import Runtime

ARTEFACT_NAMES = ("model.joblib", "model.pkl", "model.pickle")
# Estimator methods served as outputs, in the order they are offered.
METHODS = ("predict", "predict_proba", "decision_function", "transform")


def find_artefact(runtime: Runtime, names: Sequence[str]) -> Path:
    """The artefact named by ``parameters.uri``, or the first of ``names`` in the folder."""
    settings = runtime.settings
    if settings.parameters.uri:
        path = settings.resolve(settings.parameters.uri)
        if path.is_dir():
            return find_in_folder(path, names)
        if not path.exists():
            raise FileNotFoundError(f"model file {path} does not exist")
        return path
    if settings.folder is None:
        raise FileNotFoundError(f"model '{settings.name}' names no uri and has no folder")
    return find_in_folder(settings.folder, names)


def find_in_folder(folder: Path, names: Sequence[str]) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"none of {', '.join(names)} in {folder}")


class SKLearnRuntime(Runtime):
    platform = "sklearn"

    def load(self) -> None:
        self.model = joblib.load(find_artefact(self, ARTEFACT_NAMES))
        if not hasattr(self.model, "predict") and not hasattr(self.model, "transform"):
            raise TypeError(f"{type(self.model).__name__} has neither predict nor transform")
        self.methods = [m for m in METHODS if hasattr(self.model, m)]
        self.n_features = getattr(self.model, "n_features_in_", None)
        names = getattr(self.model, "feature_names_in_", None)
        self.feature_names = [str(n) for n in names] if names is not None else None
        if self.feature_names is not None:
            self.accepts = "dataframe"

    def inputs(self) -> list[TensorSpec]:
        declared = super().inputs()
        if declared:
            return declared
        if self.feature_names is not None:
            return [TensorSpec(name, "FP64", [-1, 1]) for name in self.feature_names]
        return [TensorSpec("input-0", "FP64", [-1, self.n_features or -1])]

    def outputs(self) -> list[TensorSpec]:
        declared = self.settings.output_specs()
        if declared:
            return declared
        return [self._output_spec(method) for method in self.methods]

    def _output_spec(self, method: str) -> TensorSpec:
        classes = getattr(self.model, "classes_", None)
        n_classes = len(classes) if isinstance(classes, np.ndarray) else -1
        if method == "predict":
            datatype = datatype_of(classes) if isinstance(classes, np.ndarray) else "FP64"
            return TensorSpec("predict", datatype, [-1])
        if method == "predict_proba":
            return TensorSpec("predict_proba", "FP64", [-1, n_classes])
        if method == "decision_function":
            shape = [-1] if n_classes == 2 else [-1, n_classes]
            return TensorSpec("decision_function", "FP64", shape)
        return TensorSpec(method, "FP64", [-1, -1])

    def default_outputs(self) -> list[str]:
        return ["predict" if "predict" in self.methods else self.methods[0]]

    def validate(self, payload: Any) -> None:
        if self.n_features is None or self.feature_names is not None:
            return
        shape = np.shape(payload)
        if len(shape) != 2:
            raise BadRequest(
                f"model '{self.name}' expects a 2-D input [rows, {self.n_features}], "
                f"got shape {list(shape)}"
            )
        if shape[1] != self.n_features:
            raise BadRequest(
                f"model '{self.name}' expects {self.n_features} features, got {shape[1]}"
            )

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        return {name: getattr(self.model, name)(payload) for name in outputs}
