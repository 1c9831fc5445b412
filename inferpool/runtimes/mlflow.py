"""The MLflow runtime: any MLflow model folder (``MLmodel``) served through its pyfunc flavour.

The signature becomes the V2 metadata. A request becomes a DataFrame (one column per
input) for a column-based signature or no signature, an array for a single tensor, or a
dict of tensors; the request parameter ``content_type`` (``pd``, ``dict``, ``np``)
overrides the choice. MLflow's own scoring API is served as the custom endpoint
``POST /v2/models/{name}/invocations``, so existing MLflow clients work unchanged.

A classifier of MLflow's sklearn flavour whose estimator has ``predict_proba`` offers it
as the output ``predict_proba`` (asked for by name; the default outputs stay the
model's). Settings naming ``mlserver_mlflow.MLflowRuntime`` get MLServer's answers
(``MLServerMLflowRuntime``): whatever the request names, the whole pyfunc result, an
array as ``output-1``, a DataFrame one output per column, a dict one per key; one value
per row as ``[N, 1]``; the response's ``content_type`` ``np``, ``pd`` or ``dict``.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
from mlflow.exceptions import MlflowException
from mlflow.pyfunc import scoring_server

from inferpool.errors import BadRequest
from inferpool.protocol.mlflow_endpoints import scoring_document
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes.artefacts import single_threaded
from inferpool.runtimes.base import Answer, Runtime
from inferpool.runtimes.load_errors import reading
from inferpool.runtimes.mlflow_schema import (
    check_payload,
    is_tensor_schema,
    model_content_type,
    specs_of,
)
from inferpool.runtimes.mlserver_outputs import (
    MLFLOW_ARRAY_OUTPUT,
    as_output,
    frame_outputs,
    mlserver_flavour,
)
from inferpool.runtimes.tabular import is_dataframe

MLMODEL = "MLmodel"
# MLflow error codes that mean the input, not the model, is wrong.
CLIENT_ERRORS = ("INVALID_PARAMETER_VALUE", "BAD_REQUEST")
PREDICT_PROBA = "predict_proba"
# Flavours whose pyfunc predicts each row alone (a fitted estimator or trees): their models
# are batched by default. A ``python_function`` model of its own may not be.
ROW_INDEPENDENT_LOADERS = frozenset({"mlflow.sklearn", "mlflow.lightgbm", "mlflow.xgboost"})


class MLflowRuntime(Runtime):
    platform = "mlflow"
    #: the sklearn-flavour estimator that computes ``predict_proba``, if it can
    estimator: Any = None

    def load(self) -> None:
        if mlserver_flavour(self.settings, "mlflow") and type(self) is MLflowRuntime:
            self.successor = MLServerMLflowRuntime(self.settings)
            self.successor.load()
            return
        folder = self._model_folder()
        with single_threaded(), reading(folder / MLMODEL, "MLflow"):
            # A flavour's loader may start OpenMP (hence single-threaded).
            self.model = mlflow.pyfunc.load_model(str(folder))
        metadata = self.model.metadata
        pyfunc = metadata.flavors.get("python_function", {})
        self.rows_independent = pyfunc.get("loader_module") in ROW_INDEPENDENT_LOADERS
        self.input_schema = metadata.get_input_schema()
        self.output_schema = metadata.get_output_schema()
        if is_tensor_schema(self.input_schema):
            self.accepts = "array" if len(self.input_schema.inputs) == 1 else "dict"
        else:
            self.accepts = "dataframe"
        self.output_names = [spec.name for spec in self.outputs()]
        # After output_names: predict_proba is computed when asked for, never by default.
        self.estimator = _probability_estimator(self.model)

    def serving(self) -> Runtime:
        return getattr(self, "successor", self)

    def _model_folder(self) -> Path:
        settings = self.settings
        folder = settings.resolve(settings.parameters.uri) if settings.parameters.uri else None
        folder = folder or settings.folder
        if folder is None:
            raise FileNotFoundError(f"model '{self.name}' names no uri and has no folder")
        if folder.name == MLMODEL:
            folder = folder.parent
        if not (folder / MLMODEL).is_file():
            raise FileNotFoundError(f"no {MLMODEL} file in {folder}")
        return folder

    def inputs(self) -> list[TensorSpec]:
        declared = super().inputs()
        if declared:
            return declared
        # Without a signature the model takes any columns; say so rather than nothing.
        return specs_of(self.input_schema, "input") or [TensorSpec("input-0", "FP64", [-1, -1])]

    def outputs(self) -> list[TensorSpec]:
        declared = self.settings.output_specs()
        if declared:
            return declared
        specs = specs_of(self.output_schema, "output") or [TensorSpec("output-0", "FP64", [-1])]
        if self.estimator is not None:
            classes = len(self.estimator.classes_)
            specs.append(TensorSpec(PREDICT_PROBA, "FP64", [-1, classes]))
        return specs

    def metadata(self) -> dict[str, Any]:
        document = super().metadata()
        # MLServer's metadata names the request content type the signature implies (it
        # overrides the settings' one), else the settings'.
        content_type = (
            model_content_type(self.input_schema) or self.settings.parameters.content_type
        )
        if content_type:
            document["parameters"] = {"content_type": content_type}
        return document

    def default_outputs(self) -> list[str]:
        # A pyfunc model computes all of its outputs in one call; return them all.
        return list(self.output_names)

    def validate(self, payload: Any) -> None:
        check_payload(self.name, payload, self.input_schema)

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        if self.estimator is None or PREDICT_PROBA not in outputs:
            return self._pyfunc_outputs(payload, outputs)
        others = [name for name in outputs if name != PREDICT_PROBA]
        computed = self._pyfunc_outputs(payload, others) if others else {}
        computed[PREDICT_PROBA] = self._probabilities(payload)
        return {name: computed[name] for name in outputs}

    def _probabilities(self, payload: Any) -> np.ndarray:
        """The estimator's ``predict_proba`` on the rows the pyfunc would get: columns in
        the order it was fitted on (by name, else the signature's), else as an array."""
        estimator = self.estimator
        data = payload
        if is_dataframe(data):
            fitted = getattr(estimator, "feature_names_in_", None)
            if fitted is not None:
                data = data[[str(name) for name in fitted]]
            else:
                schema = self.input_schema
                if schema is not None and schema.has_input_names():
                    data = data[schema.input_names()]
                data = data.to_numpy()
        try:
            probabilities: np.ndarray = estimator.predict_proba(data)
        except (ValueError, TypeError) as exc:  # scikit-learn refusing the input
            raise BadRequest(f"model '{self.name}': {_first_line(str(exc))}") from None
        return probabilities

    def _pyfunc_outputs(self, payload: Any, outputs: Sequence[str]) -> dict[str, Any]:
        named = named_outputs(self._predict(payload, None), self.output_names)
        if list(outputs) == self.output_names:
            return named
        missing = [name for name in outputs if name not in named]
        if missing:
            raise BadRequest(
                f"model '{self.name}' did not return {', '.join(missing)}; "
                f"it returned {', '.join(named)}"
            )
        return {name: named[name] for name in outputs}

    def _predict(self, data: Any, params: dict[str, Any] | None) -> Any:
        """The pyfunc prediction; MLflow's complaints about the input become a 400."""
        try:
            return self.model.predict(data, params=params)
        except MlflowException as exc:
            if exc.error_code in CLIENT_ERRORS:
                raise BadRequest(f"model '{self.name}': {_first_line(exc.message)}") from None
            raise

    def custom_endpoints(self) -> dict[str, Callable[[bytes], Any]]:
        return {"invocations": self.invocations}

    def invocations(self, body: bytes) -> bytes:
        """MLflow's scoring API: ``dataframe_split``, ``dataframe_records``, ``instances``
        or ``inputs`` (and optional ``params``) in, ``{"predictions": ...}`` out."""
        key, value, params = scoring_document(body)
        data = {key: value}
        try:
            parsed = scoring_server.infer_and_parse_data(data, self.input_schema)
        except MlflowException as exc:
            raise BadRequest(f"invocations: {_first_line(exc.message)}") from None
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"invocations: cannot read the input ({exc})") from None
        predictions = self._predict(parsed, params)
        out = io.StringIO()
        scoring_server.predictions_to_json(predictions, out)  # type: ignore[no-untyped-call]
        return out.getvalue().encode()


class MLServerMLflowRuntime(MLflowRuntime):
    """MLServer's MLflow runtime: the pyfunc's whole result, encoded as MLServer does."""

    # MLServer answers the whole result, whatever names the request asks for.
    open_outputs = True

    def outputs(self) -> list[TensorSpec]:
        declared = self.settings.output_specs()
        if declared:
            return declared
        specs = specs_of(self.output_schema, "output")
        if self.output_schema is None or not self.output_schema.has_input_names():
            # MLServer names an array result output-1, whatever the signature says.
            first = specs[0] if specs else TensorSpec(MLFLOW_ARRAY_OUTPUT, "FP64", [-1])
            specs = [TensorSpec(MLFLOW_ARRAY_OUTPUT, first.datatype, first.shape)]
        return [
            TensorSpec(spec.name, spec.datatype, [-1, 1]) if len(spec.shape) == 1 else spec
            for spec in specs
        ]

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        # The response's content type names MLServer's codec: pandas, dict or numpy.
        result = self._predict(payload, None)
        if is_dataframe(result):
            return Answer(frame_outputs(result), {"content_type": "pd"})
        if isinstance(result, dict):
            tensors = {str(key): as_output(_values(value)) for key, value in result.items()}
            return Answer(tensors, {"content_type": "dict"})
        return Answer({MLFLOW_ARRAY_OUTPUT: as_output(_values(result))}, {"content_type": "np"})


def _probability_estimator(model: Any) -> Any:
    """The estimator of an sklearn-flavour model, if it gives class probabilities."""
    if "sklearn" not in model.metadata.flavors:
        return None
    estimator = model.get_raw_model()
    if hasattr(estimator, PREDICT_PROBA) and hasattr(estimator, "classes_"):
        return estimator
    return None


def named_outputs(result: Any, names: Sequence[str]) -> dict[str, Any]:
    """A pyfunc result as V2 outputs: one per DataFrame column or dict key, else one."""
    if is_dataframe(result):
        columns = [str(c) for c in result.columns]
        if len(columns) == 1 and columns[0] not in names and names:
            return {names[0]: _values(result.iloc[:, 0])}
        return {c: _values(result[c]) for c in result.columns}
    if isinstance(result, dict):
        return {str(k): _values(v) for k, v in result.items()}
    return {names[0] if names else "output-0": _values(result)}


def _values(values: Any) -> np.ndarray:
    """An array the codecs can encode; datetimes as ISO 8601 strings (V2 has no datetime)."""
    array = values.to_numpy() if hasattr(values, "to_numpy") else np.asarray(values)
    if array.dtype.kind == "M":
        return np.datetime_as_string(array).astype(object)
    if array.dtype.kind == "O" and array.size and isinstance(array.flat[0], np.ndarray | list):
        # A column of equal-length vectors is one more dimension.
        return np.stack([np.asarray(v) for v in array])
    return array


def _first_line(message: str) -> str:
    """The gist of an MLflow message, which often quotes the whole input before the error."""
    text = str(message).strip()
    if "Error: " in text:
        text = text.rsplit("Error: ", 1)[1].strip()
    return text.splitlines()[0] if text else "invalid input"
