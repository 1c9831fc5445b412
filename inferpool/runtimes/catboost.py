"""The CatBoost runtime: models saved with ``save_model`` (``model.cbm``, or MLServer's
``model.bin``), classifiers, regressors and rankers, categorical features included.

The file says what the model is: CatBoost's ``to_classifier``/``to_regressor``/
``to_ranker`` give the scikit-learn-API estimator of its loss function, whose own calls
answer the outputs: ``predict`` (class labels of a classifier, values of a regressor or a
ranker), ``predict_proba`` (a classifier's) and ``raw_formula_val`` (CatBoost's
``RawFormulaVal``: the sum of the trees, before the link function). Not handled yet:
text and embedding features (the metadata and the input checks know numbers and
categories only).

A model of numeric features with symmetric trees is predicted by inferpool's tree kernel
(``trees/from_catboost.py``) once its outputs match CatBoost's on probe rows; any other
(categorical, text or embedding features, non-symmetric trees) by CatBoost's ``predict``.
``predicted_by`` (the load log) says which, and why.

Inputs: a model without categorical features takes a numeric ``[rows, features]``
array (or a ``pd`` request with one column per feature). A model with categorical
features takes a table: one input per feature, named as the model names it (any order;
categorical ones BYTES, as strings), or the features by position (one ``[rows,
features]`` BYTES input, numbers as text), as CatBoost itself takes them by name or by
index.

Settings naming ``mlserver_catboost.CatboostModel`` get MLServer 1.7.1's answers
(``MLServerCatBoostRuntime``): the file read as a ``CatBoostClassifier`` and the one
output ``predict`` as ``[N, 1]``, whatever the request names, except ``predict_proba``
and ``raw_formula_val``, answered when named (MLServer has no such outputs).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import catboost
import numpy as np

from inferpool.errors import BadRequest
from inferpool.protocol.datatypes import datatype_of
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes.artefacts import find_artefact
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.load_errors import reading
from inferpool.runtimes.mlserver_outputs import as_output, find_mlserver_artefact, mlserver_flavour
from inferpool.runtimes.tabular import check_matrix, check_rows, is_dataframe
from inferpool.runtimes.trees import Unsupported, compile_model, probe_rows
from inferpool.runtimes.trees.from_catboost import CompiledCatBoost, model_json

LIBRARY = "CatBoost"  # as load errors name it
ARTEFACT_NAMES = ("model.cbm", "model.bin")
RAW_OUTPUT = "raw_formula_val"
# The prediction type of each output, as CatBoost's ``predict`` names it.
PREDICTION_TYPES = {"predict_proba": "Probability", RAW_OUTPUT: "RawFormulaVal"}
ALL_OUTPUTS = ("predict", "predict_proba", RAW_OUTPUT)  # a classifier's


class CatBoostRuntime(Runtime):
    platform = "catboost"
    # CatBoost raises CatBoostError for input it refuses (a float in a categorical
    # feature, a text that is no number in a numeric one): the client's fault.
    input_errors = (catboost.CatBoostError, ValueError, TypeError)
    rows_independent = True  # trees score each row alone: requests may be joined

    #: the estimator (CatBoostClassifier, CatBoostRegressor...) whose calls answer
    model: Any
    #: class labels of a classifier; None for a regressor or a ranker
    classes: np.ndarray | None
    #: threads of each predict: the worker's share of the cores (``limit_threads``)
    thread_count = -1
    #: the tree kernel's compiled model, or None: CatBoost predicts (``predicted_by`` says why)
    compiled: CompiledCatBoost | None = None

    def load(self) -> None:
        if mlserver_flavour(self.settings, "catboost"):
            self.successor = MLServerCatBoostRuntime(self.settings)
            self.successor.load()
            return
        self._load(find_artefact(self, ARTEFACT_NAMES))

    def _load(self, path: Path) -> None:
        with reading(path, LIBRARY):
            model = catboost.CatBoost()
            model.load_model(str(path))  # reads the file; starts no thread (fork-safe)
            self.adopt(_as_estimator(model))

    def adopt(self, model: Any) -> None:
        """Serve an in-memory CatBoost model."""
        self.model = model
        self.feature_names = [str(name) for name in model.feature_names_]
        self.n_features = len(self.feature_names)
        self.cat_features = frozenset(model.get_cat_feature_indices())
        _, bias = model.get_scale_and_bias()
        #: raw values per row: classes of a multi-class model, targets of a multi-target
        #: regressor, else 1 (CatBoost keeps one bias per dimension)
        self.n_scores = len(bias) if isinstance(bias, list) else 1
        self.classes = _classes(model, self.n_scores)
        #: the outputs this runtime computes (whatever the settings declare)
        self.computed = ("predict", RAW_OUTPUT) if self.classes is None else ALL_OUTPUTS
        if self.cat_features:
            self.accepts = "dataframe"
        compiled, self.predicted_by = compile_model(
            self.settings, LIBRARY, self._compile, self._kernel_checks
        )
        self.compiled = compiled

    def _compile(self) -> CompiledCatBoost:
        if self.cat_features:  # the JSON export of their counters is not read
            raise Unsupported("categorical features")
        return CompiledCatBoost(model_json(self.model), self.classes, self.n_features)

    def _kernel_checks(self, compiled: Any) -> tuple[dict[str, Any], list[Any]]:
        """Every output of the kernel against CatBoost's on one thread (the template loads
        models: no thread may be started before it forks), on probe rows."""
        outputs = {
            name: (
                functools.partial(compiled.output, name),
                functools.partial(self._library_output, name, thread_count=1),
            )
            for name in self.computed
        }
        forest = compiled.forest
        return outputs, [probe_rows(forest), probe_rows(forest, np.float32)]

    def serving(self) -> Runtime:
        return getattr(self, "successor", self)

    def limit_threads(self, threads: int) -> None:
        self.thread_count = max(1, int(threads))

    def inputs(self) -> list[TensorSpec]:
        declared = super().inputs()
        if declared:
            return declared
        if not self.cat_features:
            parameters = {"feature_names": list(self.feature_names)}
            return [TensorSpec("input-0", "FP64", [-1, self.n_features], parameters)]
        return [
            # BYTES (text, decoded in ``_features``) or integers, as CatBoost takes them.
            TensorSpec(name, "BYTES", [-1, 1])
            if index in self.cat_features
            else TensorSpec(name, "FP64", [-1, 1])
            for index, name in enumerate(self.feature_names)
        ]

    def outputs(self) -> list[TensorSpec]:
        declared = self.settings.output_specs()
        if declared:
            return declared
        scores = [-1] if self.n_scores == 1 else [-1, self.n_scores]
        if self.classes is None:
            return [TensorSpec("predict", "FP64", scores), TensorSpec(RAW_OUTPUT, "FP64", scores)]
        return [
            TensorSpec("predict", datatype_of(self.classes), [-1]),
            TensorSpec("predict_proba", "FP64", [-1, len(self.classes)]),
            TensorSpec(RAW_OUTPUT, "FP64", scores),
        ]

    def default_outputs(self) -> list[str]:
        return ["predict"]

    def validate(self, payload: Any) -> None:
        # Shapes and columns only, nothing copied: the values are CatBoost's to check
        # (``input_errors``) and ``predict`` builds what CatBoost takes.
        if is_dataframe(payload):
            self._column_order(payload)
            check_rows(self.name, len(payload))
        else:
            numeric = not self.cat_features
            check_matrix(self.name, payload, self.n_features, numeric=numeric)

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        features = self._features(payload)
        return {name: self._output(name, features) for name in outputs}

    def _output(self, name: str, features: Any) -> np.ndarray:
        """One output on the checked features: the tree kernel's when it serves the model
        (a numeric matrix), else CatBoost's own call's."""
        if name not in self.computed:
            computed = ", ".join(self.computed)
            raise ValueError(f"{self.platform} computes {computed}, not {name!r}")
        if self.compiled is not None:
            return self.compiled.output(name, features)
        return self._library_output(name, features, self.thread_count)

    def _library_output(self, name: str, features: Any, thread_count: int) -> np.ndarray:
        """One of the computed outputs from CatBoost's own ``predict``."""
        if name == "predict":
            values = np.asarray(self.model.predict(features, thread_count=thread_count))
            # A multi-class model's labels come as a column: one label per row.
            return values.reshape(-1) if self.classes is not None else values
        predict = self.model.predict
        if isinstance(self.model, catboost.CatBoostRanker):  # takes no prediction_type
            predict = functools.partial(catboost.CatBoost.predict, self.model)
        values = predict(
            features, prediction_type=PREDICTION_TYPES[name], thread_count=thread_count
        )
        return np.asarray(values)

    def _features(self, payload: Any) -> Any:
        """What CatBoost's ``predict`` takes for the payload: a numeric matrix, or a
        DataFrame of the model's features in its order (text as ``str``)."""
        if not self.cat_features:
            if is_dataframe(payload):
                payload = self._ordered(payload).to_numpy()
            return check_matrix(self.name, payload, self.n_features)
        if not is_dataframe(payload):
            import pandas as pd  # a categorical model's payload is a table

            matrix = check_matrix(self.name, payload, self.n_features, numeric=False)
            payload = pd.DataFrame(matrix, columns=self.feature_names)
        frame = self._ordered(payload)
        # BYTES arrive as bytes (CatBoost takes str; a column of a tensor is all bytes or
        # none); numbers sent as text CatBoost parses itself.
        encoded = [
            str(name)
            for name, dtype in frame.dtypes.items()
            if dtype.kind == "O" and isinstance(frame[name].iat[0], bytes)
        ]
        if not encoded:
            return frame
        return frame.assign(**{name: [_text(v) for v in frame[name]] for name in encoded})

    def _ordered(self, frame: Any) -> Any:
        """The frame's columns as the model's features (CatBoost reads a DataFrame's
        columns in order and checks their names)."""
        order = self._column_order(frame)
        if order == "names":
            frame = frame[self.feature_names]
        elif order == "position":
            frame = frame.set_axis(self.feature_names, axis=1)
        check_rows(self.name, len(frame))
        return frame

    def _column_order(self, frame: Any) -> str:
        """How the frame's columns are the model's features: "same" (its names in its
        order), "names" (in another order), "position" (no feature's name, as many
        columns); else a 400 naming the features."""
        names = [str(column) for column in frame.columns]
        if names == self.feature_names:
            return "same"
        if sorted(names) == sorted(self.feature_names):
            return "names"
        if len(names) == self.n_features and not set(names) & set(self.feature_names):
            return "position"
        raise BadRequest(
            f"model '{self.name}' expects the features {', '.join(self.feature_names)} "
            f"(by name, or {self.n_features} columns by position), got "
            f"{', '.join(names) or 'none'}"
        )


class MLServerCatBoostRuntime(CatBoostRuntime):
    """MLServer's CatBoost runtime: ``model.cbm`` or ``model.bin``; ``predict`` is the
    classifier's ``predict`` as ``[N, 1]``, whatever output the request names, except the
    two inferpool adds (``predict_proba``, ``raw_formula_val``), answered when named."""

    open_outputs = True

    def load(self) -> None:
        self._load(find_mlserver_artefact(self.settings, "catboost"))

    def outputs(self) -> list[TensorSpec]:
        declared = self.settings.output_specs()
        if declared:
            return declared
        predict = super().outputs()[0]
        shape = [-1, 1] if len(predict.shape) == 1 else predict.shape
        return [TensorSpec("predict", predict.datatype, shape)]

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        features = self._features(payload)
        names = [name for name in outputs if name in PREDICTION_TYPES] or ["predict"]
        return {name: as_output(self._output(name, features)) for name in names}


def _as_estimator(model: catboost.CatBoost) -> Any:
    """The scikit-learn-API estimator of the model's loss function, as CatBoost's own
    conversions decide (each refuses a loss that is not its kind): a classifier's
    ``predict`` answers labels, a regressor's and a ranker's values."""
    for convert in (catboost.to_classifier, catboost.to_regressor, catboost.to_ranker):
        try:
            return convert(model)
        except catboost.CatBoostError:
            continue
    return model  # a custom objective: CatBoost's plain predict (raw values)


def _classes(model: Any, n_scores: int) -> np.ndarray | None:
    """A classifier's labels as the file keeps them, else 0..k-1; None for another model."""
    if not isinstance(model, catboost.CatBoostClassifier):
        return None
    labels = model.classes_
    if labels is not None and len(labels):
        return np.asarray(labels)
    return np.arange(max(2, n_scores))


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value
