"""The LightGBM runtime: Booster text files (``model.txt``) and pickled LightGBM models
(``LGBMClassifier``/``LGBMRegressor``/... or a ``Booster``, saved with joblib or pickle).

Outputs: ``predict`` (class labels of a classifier, values of a regressor),
``predict_proba``, ``raw_score`` and ``contrib`` (LightGBM's ``pred_contrib``: one column
per feature plus the expected value, repeated per class for a multi-class model).

Settings naming ``mlserver_lightgbm.LightGBMModel`` get MLServer's runtime instead
(``MLServerLightGBMRuntime``): ``model.bst``, and the one output ``predict`` holding
``Booster.predict`` (probabilities of a classifier) as ``[N, 1]`` or ``[N, classes]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import lightgbm
import numpy as np

from inferpool.protocol.types import TensorSpec
from inferpool.runtimes.artefacts import (
    single_threaded,
)
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.boosted import BoostedTreesRuntime
from inferpool.runtimes.load_errors import reading
from inferpool.runtimes.mlserver_outputs import (
    as_output,
    find_mlserver_artefact,
    refuse_pickle,
)
from inferpool.runtimes.tabular import features_matrix
from inferpool.runtimes.trees.from_lightgbm import CompiledLightGBM

LIBRARY = "LightGBM"  # as load errors name it
ARTEFACT_NAMES = ("model.txt", "model.bst", "model.joblib", "model.pkl", "model.pickle")
# LightGBM objectives (and their aliases) whose model outputs class probabilities.
BINARY_OBJECTIVES = ("binary",)
MULTICLASS_OBJECTIVES = ("multiclass", "softmax", "multiclassova", "multiclass_ova", "ova", "ovr")


class LightGBMRuntime(BoostedTreesRuntime):
    platform = "lightgbm"
    margin_output = "raw_score"
    float_datatype = "FP64"

    def load(self) -> None:
        path = self.load_shared_forms(
            "lightgbm",
            MLServerLightGBMRuntime,
            ARTEFACT_NAMES,
            LIBRARY,
            (lightgbm.LGBMModel, lightgbm.Booster),
        )
        if path is None:
            return
        with single_threaded():  # the tree kernel's check predicts with LightGBM too
            with reading(path, LIBRARY):
                booster = lightgbm.Booster(model_file=str(path))
            self.adopt(booster)

    def adopt(self, model: Any) -> None:
        """Serve an in-memory LightGBM Booster or scikit-learn-API LightGBM estimator."""
        self.predict_params: dict[str, Any] = {}
        if isinstance(model, lightgbm.LGBMModel):
            self.booster = model.booster_
            classes = getattr(model, "classes_", None)
            self.classes = np.asarray(classes) if classes is not None else None
        elif isinstance(model, lightgbm.Booster):
            self.booster = model
            self.bare_booster = True
            self.classes = _booster_classes(model)
        else:
            raise TypeError(f"{type(model).__name__} is not a LightGBM model")
        self.has_probabilities = self.classes is not None
        self.n_features = self.booster.num_feature()
        self.feature_names = list(self.booster.feature_name())
        self.n_targets = 1
        self.use_tree_kernel("LightGBM", lambda: CompiledLightGBM(self.booster))

    def serving(self) -> Runtime:
        return getattr(self, "successor", self)

    def limit_threads(self, threads: int) -> None:
        self.predict_params["num_threads"] = max(1, int(threads))

    # The Booster's predict is typed for sparse input too; a dense matrix gives an ndarray.
    def _library_values(self, matrix: np.ndarray) -> np.ndarray:
        return cast(np.ndarray, self.booster.predict(matrix, **self.predict_params))

    def _library_margin(self, matrix: np.ndarray) -> np.ndarray:
        margin = self.booster.predict(matrix, raw_score=True, **self.predict_params)
        return cast(np.ndarray, margin)

    def _contrib(self, matrix: np.ndarray) -> np.ndarray:
        contrib = self.booster.predict(matrix, pred_contrib=True, **self.predict_params)
        return cast(np.ndarray, contrib)

    def _contrib_shape(self) -> list[int]:
        return [-1, (self.n_features + 1) * self.n_scores]


class MLServerLightGBMRuntime(LightGBMRuntime):
    """MLServer's LightGBM runtime: a Booster file, ``predict`` = ``Booster.predict``."""

    # MLServer's runtime answers ``predict`` alone, whatever names the request asks for.
    open_outputs = True

    def load(self) -> None:
        path = find_mlserver_artefact(self.settings, "lightgbm")
        refuse_pickle(self.settings, path, "LightGBM")
        with single_threaded():
            with reading(path, LIBRARY):
                booster = lightgbm.Booster(model_file=str(path))
            self.adopt(booster)

    def outputs(self) -> list[TensorSpec]:
        declared = self.settings.output_specs()
        if declared:
            return declared
        return [TensorSpec("predict", self.float_datatype, [-1, self.n_scores])]

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        matrix = features_matrix(self.name, payload, self.feature_names)
        return {"predict": as_output(self._values(matrix))}


def _booster_classes(booster: lightgbm.Booster) -> np.ndarray | None:
    """Class labels 0..k-1 of a classifying Booster (it keeps no labels), else None."""
    objective = str(booster.params.get("objective", "")).split()[0:1]
    name = objective[0] if objective else ""
    if name in BINARY_OBJECTIVES:
        return np.arange(2)
    if name in MULTICLASS_OBJECTIVES:
        return np.arange(booster.num_model_per_iteration())
    return None
