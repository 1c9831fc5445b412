"""The alibi explainer runtime: a model whose prediction is an alibi explanation, answered
as MLServer's ``mlserver_alibi_explain.AlibiExplainRuntime`` answers it: one output,
``explanation`` (BYTES, shape [1], content type ``str``) holding the explanation's JSON
(``Explanation.to_json()``: its ``meta`` and ``data``), and the response's parameters
``headers`` (``x-seldon-alibi-type: explanation``, ``x-seldon-alibi-method``: the alibi
module of the explainer).

Settings are MLServer's (``alibi_explain_settings.py``). A black-box explainer
(AnchorTabular, AnchorText, AnchorImage, KernelShap) calls the model its ``infer_uri``
names through the engine (``inferpool.calls.infer``: never HTTP to this server); a
white-box one (TreeShap, the tree partial dependences, IntegratedGradients) holds its
model, loaded from the file its ``infer_uri`` names. IntegratedGradients explains a
Keras model (its environment holds TensorFlow: docs/runtimes/alibi-explain.md), every row
of a request, each for the class the model predicts unless the request's
``explain_parameters`` name a ``target``, as MLServer's does. The explainer is the one
``explainer.save`` wrote in the model's ``uri``, or one built from ``init_parameters``. As
MLServer's, the explainer also answers the explanation's plain JSON at its ``explain``
endpoint.

alibi 0.9 requires numpy<2: its models run in a per-model environment
(docs/runtimes/alibi-explain.md), whose worker imports this module on numpy 1.x.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferpool import calls
from inferpool.errors import BadRequest, ModelLoadError
from inferpool.protocol.types import InferenceRequest, TensorSpec
from inferpool.runtimes.alibi_explain_settings import (
    ExplainSettings,
    explain_parameters,
    model_of,
    read_settings,
)
from inferpool.runtimes.base import Answer, Runtime
from inferpool.runtimes.load_errors import reading

LIBRARY = "alibi"  # as load errors name it
OUTPUT = "explanation"
SAVED = "meta.dill"  # what ``explainer.save(path)`` writes beside explainer.dill
INPUT = "predict"  # the input name of MLServer's calls to a model that declares none
GRADIENTS = "IntegratedGradients"  # the white-box explainer of a Keras model


class AlibiExplainRuntime(Runtime):
    platform = "alibi-explain"
    accepts = "request"  # the request's parameters carry explain_parameters
    # alibi raises these for instances of the wrong shape or bad explain parameters.
    input_errors = (ValueError, IndexError, TypeError, KeyError)

    # MLServer also answers the explanation's own JSON (no V2 encoding) at ``/explain``,
    # for its legacy clients: here at /v2/models/{name}/explain, and at /explain while
    # this is the only explainer loaded.
    bare_endpoints = True

    explain_settings: ExplainSettings

    def load(self) -> None:
        import alibi.explainers

        self.explain_settings = found = read_settings(self.settings.parameters.extra)
        self.alibi_type = getattr(alibi.explainers, found.alibi_class)
        self.folder = None if found.init_parameters is not None else self._saved_folder()
        self._lock = threading.Lock()
        self.explainer: Any = None
        self._failed_call: calls.CallError | None = None
        self._loading = False
        if found.black_box:
            self.model, self.version = model_of(found.infer_uri)
            # Anchors and KernelShap call their predictor while they are built, and the
            # model they explain may still be loading: built on the first request, unless
            # built now without calling the model (the predictor raises _NotYet meanwhile).
            self._loading = True
            try:
                self.explainer = self._build(self._call_model)
            except _NotYet:
                self.explainer = None
            finally:
                self._loading = False
        else:
            self.model, self.version = found.infer_uri, None
            self.white_box = self._white_box_model()
            self.explainer = self._build(self.white_box)

    def predictor(self) -> str:
        return f"{self.explain_settings.alibi_class} of alibi explaining '{self.model}'"

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec(OUTPUT, "BYTES", [1, 1], {"content_type": "str"})]

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        request: InferenceRequest = payload
        instances = instances_of(request)
        parameters = explain_parameters(
            self.explain_settings.explain_parameters, request.parameters
        )
        gradients = self.explain_settings.alibi_class == GRADIENTS
        if not self.explain_settings.explainer_batch and self.explain_settings.black_box:
            # Anchors explain one instance: MLServer's black-box explainers explain the
            # request's first row; its white-box ones (TreeShap, IntegratedGradients...)
            # are handed every row, whatever explainer_batch says.
            instances = instances[0]
        with self._lock:  # one build; alibi's explainers keep state while explaining
            self._failed_call = None
            if gradients and "target" not in parameters:
                # MLServer's target: the class the model predicts for each row.
                parameters["target"] = np.asarray(self.white_box(instances)).argmax(axis=1)
            try:
                if self.explainer is None:
                    self.explainer = self._build(self._call_model, loading=False)
                explanation = self.explainer.explain(instances, **parameters)
            except Exception:
                # alibi wraps some of its predictor's errors in its own ("Predictor failed
                # to be called"): the failed call's status and message say more.
                if self._failed_call is not None:
                    raise self._failed_call from None
                raise
        method = type(self.explainer).__module__.rsplit(".", 1)[-1]
        headers = {"x-seldon-alibi-type": "explanation", "x-seldon-alibi-method": method}
        # MLServer's StringCodec makes a list of one string a [1, 1] tensor: its shape.
        answer = np.array([[explanation.to_json()]], dtype=object)
        return Answer({OUTPUT: answer}, {"headers": headers})

    def custom_endpoints(self) -> dict[str, Any]:
        return {"explain": self._plain_explanation}

    def _plain_explanation(self, body: bytes) -> bytes:
        """A V2 request's explanation as its own JSON document."""
        from inferpool.protocol import rest_json

        answer = self.predict(rest_json.decode_request(body), [OUTPUT])
        return str(answer[OUTPUT][0, 0]).encode()

    def _build(self, predictor: Any, loading: bool = True) -> Any:
        """The explainer, loaded from its folder or built from ``init_parameters``; a
        saved one's errors are load errors while ``loading`` (a request's otherwise)."""
        found = self.explain_settings
        if self.folder is None:
            assert found.init_parameters is not None
            try:
                explainer = self.alibi_type(predictor, **found.init_parameters)
            except TypeError as error:
                raise ModelLoadError(
                    f"parameters.extra.init_parameters do not fit {found.alibi_class} ({error})"
                ) from None
            if found.alibi_class == "TreeShap":
                explainer.fit()  # path-dependent: TreeShap needs no background data
            return explainer
        from alibi.saving import load_explainer

        if not loading:
            return load_explainer(str(self.folder), predictor=predictor)
        with reading(self.folder / "explainer.dill", LIBRARY):
            return load_explainer(str(self.folder), predictor=predictor)

    def _saved_folder(self) -> Path:
        """The folder ``explainer.save`` wrote, of the explainer the settings name."""
        uri = self.settings.parameters.uri
        folder = self.settings.resolve(uri) if uri else self.settings.folder
        if folder is None or not (folder / SAVED).is_file():
            raise ModelLoadError(
                f"{folder} holds no saved alibi explainer (no {SAVED}: write one with "
                "explainer.save(path), or give parameters.extra.init_parameters)"
            )
        import dill

        with reading(folder / SAVED, LIBRARY), open(folder / SAVED, "rb") as file:
            saved = dill.load(file).get("name")
        if saved != self.explain_settings.alibi_class:
            raise ModelLoadError(
                f"{folder} holds a saved {saved}, not the {self.explain_settings.alibi_class} "
                f"parameters.extra.explainer_type '{self.explain_settings.explainer_type}' names"
            )
        return folder

    def _white_box_model(self) -> Any:
        path = self.settings.resolve(self.explain_settings.infer_uri)
        if self.explain_settings.alibi_class == GRADIENTS:
            return keras_model(path, self.explain_settings.infer_uri)
        if not path.is_file():
            raise ModelLoadError(
                f"parameters.extra.infer_uri {self.explain_settings.infer_uri!r}: no model file "
                f"{path} (a white-box explainer holds its model: a joblib or pickle file)"
            )
        import joblib

        with reading(path, "joblib"):
            return joblib.load(path)

    def _call_model(self, instances: Any) -> np.ndarray:
        """The explained model's answer for the explainer's instances, as alibi takes it:
        its first (or ``infer_output``) output, a trailing dimension of 1 dropped."""
        if self._loading:
            raise _NotYet
        output = self.explain_settings.infer_output
        try:
            answer = calls.infer(
                self.model,
                model_inputs(instances),
                version=self.version,
                outputs=[output] if output else None,
            )
        except calls.CallError as error:
            if error.status == 404:
                error = calls.CallError(
                    503,
                    f"explainer '{self.name}' explains model '{self.model}' (its infer_uri), "
                    f"which this server does not serve: {error.message}",
                )
            self._failed_call = error
            raise error from None
        data = np.asarray(answer["outputs"][0]["data"])
        if data.ndim > 1 and data.shape[-1] == 1:
            data = data.squeeze(axis=-1)
        return data


def keras_model(path: Path, infer_uri: str) -> Any:
    """The Keras model IntegratedGradients explains: an HDF5 or .keras file, or a
    SavedModel folder. TensorFlow is imported only here: alibi's other explainers run in
    environments without it."""
    if not path.exists():
        raise ModelLoadError(
            f"parameters.extra.infer_uri {infer_uri!r}: no Keras model {path} "
            "(IntegratedGradients holds its model: an HDF5 or .keras file, or a SavedModel "
            "folder)"
        )
    with reading(path, "TensorFlow"):
        import tensorflow as tf

        # Not compiled: explaining needs its layers and weights, not its optimizer.
        return tf.keras.models.load_model(str(path), compile=False)


class _NotYet(BaseException):
    """Building the explainer needs the explained model's answers (a BaseException:
    ``reading`` turns Exceptions into load errors, alibi catches none of this)."""


def instances_of(request: InferenceRequest) -> Any:
    """The request's instances as alibi takes them: its one input as an array (a list of
    str for BYTES, AnchorText's), or several inputs side by side as columns."""
    if not request.inputs:
        raise BadRequest("an explainer takes one input: the instances to explain")
    columns = []
    for tensor in request.inputs:
        data = np.asarray(tensor.data).reshape(tensor.shape)
        if tensor.datatype == "BYTES":
            texts = [t.decode() if isinstance(t, bytes) else str(t) for t in data.ravel()]
            if len(request.inputs) == 1:
                return texts
            data = np.asarray(texts, dtype=object).reshape(data.shape)
        columns.append(data)
    if len(columns) == 1:
        return columns[0]
    if any(column.ndim > 2 or (column.ndim == 2 and column.shape[1] != 1) for column in columns):
        raise BadRequest("an explainer's several inputs must be columns (one value a row)")
    return np.column_stack([column.reshape(len(column), -1) for column in columns])


def model_inputs(instances: Any) -> Any:
    """The V2 inputs of a call to the explained model: one input of the instances
    (strings as BYTES with content type ``str``), as MLServer sends them."""
    if isinstance(instances, list | tuple) or np.asarray(instances).dtype.kind in "OUS":
        texts = [str(text) for text in np.asarray(instances, dtype=object).ravel()]
        return [
            {"name": INPUT, "datatype": "BYTES", "shape": [len(texts)], "data": texts,
             "parameters": {"content_type": "str"}}
        ]  # fmt: skip
    return {INPUT: np.asarray(instances)}
