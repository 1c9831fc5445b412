"""The XGBoost runtime: Booster files (``model.json``, ``model.ubj``, ``model.bst``,
``model.xgb``) and pickled XGBoost models (``XGBClassifier``/``XGBRegressor``/... or a
``Booster``, saved with joblib or pickle).

Outputs: ``predict`` (class labels of a classifier, values of a regressor),
``predict_proba``, ``margin`` and ``contrib`` (XGBoost's ``pred_contribs``: one column per
feature plus the bias, per class for a multi-class model). Everything but ``contrib``
uses ``inplace_predict``, which reads the request's array without a DMatrix copy.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import xgboost

from inferpool.runtimes.artefacts import (
    PICKLE_SUFFIXES,
    find_artefact,
    single_threaded,
    unpickle,
)
from inferpool.runtimes.boosted import BoostedTreesRuntime
from inferpool.runtimes.trees.from_xgboost import CompiledXGBoost
from inferpool.runtimes.trees.verify import FLOAT32_RTOL

ARTEFACT_NAMES = (
    "model.json",
    "model.ubj",
    "model.bst",
    "model.xgb",
    "model.joblib",
    "model.pkl",
    "model.pickle",
)
# Objectives whose plain prediction is a probability (P(class 1), or one per class).
PROBABILITY_OBJECTIVES = ("binary:logistic", "multi:softprob")
# Objectives whose plain prediction is a class index.
LABEL_OBJECTIVES = ("multi:softmax", "binary:hinge")


class XGBoostRuntime(BoostedTreesRuntime):
    platform = "xgboost"
    margin_output = "margin"
    float_datatype = "FP32"

    def load(self) -> None:
        path = find_artefact(self, ARTEFACT_NAMES)
        if path.suffix in PICKLE_SUFFIXES:
            self.adopt(unpickle(path))
            return
        booster = xgboost.Booster()
        with single_threaded():
            # From bytes, so XGBoost tells JSON, UBJSON and its old binary format apart by
            # content, whatever the file's extension.
            booster.load_model(bytearray(path.read_bytes()))
            self.adopt(booster)

    def adopt(self, model: Any) -> None:
        """Serve an in-memory XGBoost Booster or scikit-learn-API XGBoost estimator."""
        # Arguments of every inplace_predict: the trees to use and the missing-value marker.
        self.predict_params: dict[str, Any] = {}
        if isinstance(model, xgboost.XGBModel):
            self.booster = model.get_booster()
            self.predict_params["missing"] = model.missing
            best = getattr(model, "best_iteration", None) if _early_stopped(model) else None
            if best is not None:
                self.predict_params["iteration_range"] = (0, int(best) + 1)
        elif isinstance(model, xgboost.Booster):
            self.booster = model
        else:
            raise TypeError(f"{type(model).__name__} is not an XGBoost model")
        learner = json.loads(self.booster.save_config())["learner"]
        self.objective = learner["objective"]["name"]
        parameters = learner["learner_model_param"]
        self.n_features = self.booster.num_features()
        names = self.booster.feature_names
        self.feature_names = list(names) if names else [f"f{i}" for i in range(self.n_features)]
        self.n_targets = max(1, int(parameters.get("num_target", 1)))
        self.classes = _classes(model, self.objective, int(parameters.get("num_class", 0)))
        self.has_probabilities = self.classes is not None and self.objective in (
            PROBABILITY_OBJECTIVES
        )
        self.use_tree_kernel(
            "XGBoost",
            lambda: CompiledXGBoost(self.booster, self.predict_params),
            rtol=FLOAT32_RTOL,
        )

    def limit_threads(self, threads: int) -> None:
        self.booster.set_param({"nthread": max(1, int(threads))})

    def _library_values(self, matrix: np.ndarray) -> np.ndarray:
        return self.booster.inplace_predict(matrix, **self.predict_params)

    def _library_margin(self, matrix: np.ndarray) -> np.ndarray:
        return self.booster.inplace_predict(matrix, predict_type="margin", **self.predict_params)

    def _contrib(self, matrix: np.ndarray) -> np.ndarray:
        # SHAP values need a DMatrix: inplace_predict computes values and margins only.
        missing = self.predict_params.get("missing", np.nan)
        data = xgboost.DMatrix(matrix, missing=missing, feature_names=self.feature_names)
        iteration_range = self.predict_params.get("iteration_range", (0, 0))
        return self.booster.predict(data, pred_contribs=True, iteration_range=iteration_range)

    def _contrib_shape(self) -> list[int]:
        if self.n_scores > 1:
            return [-1, self.n_scores, self.n_features + 1]
        return [-1, self.n_features + 1]


def _classes(model: Any, objective: str, num_class: int) -> np.ndarray | None:
    """Class labels of a classifier: the estimator's, else 0..k-1; None for a regressor."""
    if objective not in PROBABILITY_OBJECTIVES + LABEL_OBJECTIVES:
        return None
    classes = getattr(model, "classes_", None)
    if classes is not None:
        return np.asarray(classes)
    return np.arange(max(num_class, 2))


def _early_stopped(model: xgboost.XGBModel) -> bool:
    # ``best_iteration`` raises unless training stopped early; then predict uses it.
    try:
        return model.get_booster().attr("best_iteration") is not None
    except xgboost.core.XGBoostError:
        return False
