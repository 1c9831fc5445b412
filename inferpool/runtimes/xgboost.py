"""The XGBoost runtime: Booster files (``model.json``, ``model.ubj``, ``model.bst``,
``model.xgb``) and pickled XGBoost models (``XGBClassifier``/``XGBRegressor``/... or a
``Booster``, saved with joblib or pickle).

Outputs: ``predict`` (class labels of a classifier, values of a regressor),
``predict_proba``, ``margin`` and ``contrib`` (XGBoost's ``pred_contribs``: one column per
feature plus the bias, per class for a multi-class model). Everything but ``contrib``
uses ``inplace_predict``, which reads the request's array without a DMatrix copy.

Settings naming ``mlserver_xgboost.XGBoostModel`` get MLServer's runtime instead
(``MLServerXGBoostRuntime``): ``model.bst``/``model.json``/``model.ubj`` read through
XGBoost's scikit-learn interface, so a file saved by ``XGBClassifier`` answers class
labels and ``predict_proba``, and any other file (a ``Booster``'s) answers as an
``XGBRegressor``: ``predict`` is the Booster's output (probabilities of a classifier).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xgboost

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
from inferpool.runtimes.tabular import features_matrix, two_class_probabilities
from inferpool.runtimes.trees.from_xgboost import CompiledXGBoost
from inferpool.runtimes.trees.verify import FLOAT32_RTOL

LIBRARY = "XGBoost"  # as load errors name it
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
        path = self.load_shared_forms(
            "xgboost",
            MLServerXGBoostRuntime,
            ARTEFACT_NAMES,
            LIBRARY,
            (xgboost.XGBModel, xgboost.Booster),
        )
        if path is None:
            return
        booster = xgboost.Booster()
        with single_threaded():
            with reading(path, LIBRARY):
                # From bytes, so XGBoost tells JSON, UBJSON and its old binary format apart
                # by content, whatever the file's extension.
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
            self.bare_booster = True
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

    def serving(self) -> Runtime:
        return getattr(self, "successor", self)

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


class MLServerXGBoostRuntime(XGBoostRuntime):
    """MLServer's XGBoost runtime: ``predict`` and ``predict_proba`` of the model read
    as an ``XGBRegressor``, or as an ``XGBClassifier`` when it was saved by one."""

    def load(self) -> None:
        path = find_mlserver_artefact(self.settings, "xgboost")
        refuse_pickle(self.settings, path, "XGBoost")
        with single_threaded():
            with reading(path, LIBRARY):
                model = _sklearn_interface(bytearray(path.read_bytes()))
            self.adopt(model)
        # A Booster's file all the same: KServe's xgbserver answers its Booster's predict.
        self.bare_booster = True

    def adopt(self, model: Any) -> None:
        super().adopt(model)
        self.classifier = isinstance(model, xgboost.XGBClassifier)

    def outputs(self) -> list[TensorSpec]:
        declared = self.settings.output_specs()
        if declared:
            return declared
        if not self.classifier:
            return [TensorSpec("predict", self.float_datatype, [-1, self.n_scores])]
        assert self.classes is not None  # an XGBClassifier has classes
        labels = "INT32" if self.objective == "multi:softmax" else "INT64"
        return [
            TensorSpec("predict", labels, [-1, 1]),
            TensorSpec("predict_proba", self.float_datatype, [-1, len(self.classes)]),
        ]

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        matrix = features_matrix(self.name, payload, self.feature_names)
        result: dict[str, Any] = {}
        for name in outputs:
            if name == "predict_proba":
                result[name] = self._probabilities(matrix)
            elif self.classifier:
                result[name] = as_output(self._labels(self._values(matrix)))
            else:
                result[name] = as_output(self._values(matrix))
        return result

    def _labels(self, values: np.ndarray) -> np.ndarray:
        """``XGBClassifier.predict``: the class of each row from the Booster's output."""
        assert self.classes is not None
        if values.ndim > 1 and len(self.classes) != 2:
            return np.asarray(np.argmax(values, axis=1))
        if values.ndim > 1 and values.shape[1] != 1:  # multi-label: one 0/1 per label
            return (values > 0.5).astype(np.float64)
        if self.objective == "multi:softmax":  # the Booster gives class indices
            return values.astype(np.int32)
        return (values > 0.5).astype(np.int64)

    def _probabilities(self, matrix: np.ndarray) -> np.ndarray:
        """``XGBClassifier.predict_proba``: softmax of the margins for ``multi:softmax``."""
        if self.objective == "multi:softmax":
            from scipy.special import softmax  # XGBoost's own dependency

            probabilities: np.ndarray = softmax(self._margin(matrix), axis=1)
            return probabilities
        values = self._values(matrix)
        return two_class_probabilities(values) if values.ndim == 1 else values


def _sklearn_interface(model: bytearray) -> xgboost.XGBModel:
    """The model as MLServer reads it: an XGBRegressor, unless XGBoost refuses because a
    classifier saved it (the file's ``scikit_learn`` attribute)."""
    estimator: xgboost.XGBModel = xgboost.XGBRegressor()
    try:
        estimator.load_model(model)
    except TypeError:
        estimator = xgboost.XGBClassifier()
        estimator.load_model(model)
    return estimator


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
