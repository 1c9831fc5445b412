"""The alibi-detect runtime: drift, outlier and adversarial detectors saved with
alibi-detect's ``save_detector`` (a folder holding ``config.toml``, or a legacy one holding
``meta.dill``), loaded with its ``load_detector`` and answered as MLServer's
``mlserver_alibi_detect.AlibiDetectRuntime`` answers them. A legacy IForest, Mahalanobis
or SpectralResidual loads without TensorFlow, which alibi-detect's own legacy loader
needs (alibi_detect_legacy.py); the PyTorch and TensorFlow detectors (MMDDrift's torch
backend, ModelDistillation) load with ``load_detector`` from an environment holding their
framework, which this module never imports itself.

alibi-detect 0.13 requires numpy<2, which the server's own environment cannot hold: its
models run in a per-model environment (docs/runtimes/alibi-detect.md), whose worker
imports this module on numpy 1.x.

The settings are MLServer's, under ``parameters.extra``:

- ``predict_parameters``: keyword arguments of the detector's ``predict``
  (``{"return_p_val": true}``, ``{"drift_type": "feature"}``...); one its ``predict`` does
  not take fails the load (MLServer's fails every request instead);
- ``batch_size``: a detector that is not online runs once ``batch_size`` requests have
  arrived, on their rows together; each earlier request is answered with no output;
- ``state_save_freq`` (default 100): an online detector (one with ``save_state``) writes
  its state into ``<detector folder>/state`` every that many predictions.

The answer is the detector's ``data`` dict, one output per key, each value wrapped in a
list (one element per ``predict`` call: one, or one per row of an online detector fed
several rows; a number per call is a column, ``[calls, 1]``, as MLServer's NumpyCodec
answers it), and its ``meta`` dict as the response's parameters, with MLServer's
``headers`` (``x-seldon-alibi-type``, ``x-seldon-alibi-method``). Keys whose value is
None (``feature_score`` of an IForest, ``distance`` of a detector asked not to return it)
or an object (ClassifierDrift's trained ``model``) are left out: a tensor holds neither
(MLServer would put the model in a BYTES tensor its JSON encoder cannot write).

State (an online detector's time and window, Mahalanobis' running mean and covariance,
a drift detector's reference data that ``update_x_ref`` updates, or its model trained on
from call to call (``retrain_from_scratch=False``), a ``batch_size`` detector's waiting
rows) belongs to the replica that holds it: each replica sees only the requests routed
to it.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from alibi_detect.saving import load_detector

from inferpool.errors import ModelLoadError
from inferpool.runtimes.alibi_detect_legacy import without_tensorflow
from inferpool.runtimes.base import Answer, Runtime
from inferpool.runtimes.load_errors import reading
from inferpool.settings import ModelSettings

LIBRARY = "alibi-detect"  # as load errors name it
# What ``save_detector`` writes: a config-driven detector, or a legacy (dill) one.
DETECTOR_FILES = ("config.toml", "meta.dill")
# The alibi-detect subpackage a detector's class lives in, as MLServer names its kind.
KINDS = {"cd": "drift", "od": "outlier", "ad": "adversarial"}
STATE_FOLDER = "state"  # where an online detector's state is saved, in its folder
DEFAULT_STATE_SAVE_FREQ = 100
# Detectors without ``save_state`` whose ``predict`` always changes them (alibi-detect 0.13).
UPDATED_BY_PREDICT = frozenset({"Mahalanobis"})
# A drift detector's setting that makes its ``predict`` update its reference data with the
# rows it tests (``{"last": n}`` or ``{"reservoir_sampling": n}``; ``update_ref`` for
# ContextMMDDrift).
UPDATE_SETTINGS = ("update_x_ref", "update_ref")


class AlibiDetectRuntime(Runtime):
    platform = "alibi-detect"
    # A detector answers under its own names (is_drift, p_val...), whatever is asked.
    open_outputs = True
    # alibi-detect raises these for data of the wrong shape or bad predict parameters.
    input_errors = (ValueError, IndexError, TypeError)

    detector: Any
    folder: Path
    online: bool

    def load(self) -> None:
        self.folder = detector_folder(self.settings.parameters.uri, self.settings)
        extra = self.settings.parameters.extra
        self.predict_parameters = _mapping(extra.get("predict_parameters"), "predict_parameters")
        self.batch_size = _positive(extra.get("batch_size"), "batch_size", None)
        self.state_save_freq = _positive(
            extra.get("state_save_freq"), "state_save_freq", DEFAULT_STATE_SAVE_FREQ
        )
        marker = next(
            self.folder / name for name in DETECTOR_FILES if (self.folder / name).exists()
        )
        with reading(marker, LIBRARY):
            self.detector = without_tensorflow(self.folder) or load_detector(str(self.folder))
        check_predict_parameters(self.detector, self.predict_parameters)
        self.online = hasattr(self.detector, "save_state")
        # Mahalanobis updates its mean and covariance at each predict, but saves no state:
        # it is not online as MLServer counts (a request's rows are one predict call).
        # SpectralResidual's meta says online too (it scores a stream), but it keeps none.
        self.stateful = self.online or updated_by_predict(self.detector)
        module = type(self.detector).__module__.split(".")
        self.headers = {
            "x-seldon-alibi-type": KINDS.get(module[-2] if len(module) > 1 else "", "unknown"),
            "x-seldon-alibi-method": module[-1],
        }
        # One predict at a time: a detector's state (an online one's window, the rows
        # waiting for ``batch_size``) must see the requests one after the other.
        self._lock = threading.Lock()
        self._waiting: list[np.ndarray] = []

    def predictor(self) -> str:
        state = " (keeps state: each replica its own)" if self.stateful else ""
        return f"{type(self.detector).__name__} of alibi-detect{state}"

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        rows = np.asarray(payload)
        with self._lock:
            if self.batch_size and not self.online:
                self._waiting.append(rows)
                if len(self._waiting) < self.batch_size:  # requests, as MLServer counts
                    return Answer({}, {})
                # Taken out first: rows that do not join (a 400) wait no longer.
                waiting, self._waiting = self._waiting, []
                rows = np.concatenate(waiting)
            # An online detector takes one instance per predict: several rows are
            # several steps; one row, or a batch for any other detector, is one call.
            calls = list(rows) if self.online and len(rows) > 1 else [rows]
            answers = [self._predict_one(x) for x in calls]
        return self._answer(answers)

    def _predict_one(self, x: np.ndarray) -> dict[str, Any]:
        answer: dict[str, Any] = self.detector.predict(x, **self.predict_parameters)
        if self.online and self.detector.t > 0 and self.detector.t % self.state_save_freq == 0:
            self.detector.save_state(str(self.folder / STATE_FOLDER))
        return answer

    def _answer(self, answers: list[dict[str, Any]]) -> Answer:
        first = answers[0]
        tensors = {
            key: as_mlserver_answers(np.asarray([answer["data"][key] for answer in answers]))
            for key, value in first["data"].items()
            if is_tensor(value)
        }
        meta = dict(first.get("meta", {}))
        meta["headers"] = dict(self.headers)
        return Answer(tensors, meta)


def as_mlserver_answers(values: np.ndarray) -> np.ndarray:
    """``values`` as MLServer's NumpyCodec answers them: a one-dimensional array (a
    number per predict call: ``is_drift``, ``threshold``...) as a column, ``[calls, 1]``."""
    return values[:, None] if values.ndim == 1 else values


def detector_folder(uri: str | None, settings: ModelSettings) -> Path:
    """The folder ``save_detector`` wrote: ``uri`` (or the model's folder), which must
    hold one of ``DETECTOR_FILES``; else a one-sentence ModelLoadError."""
    folder = settings.resolve(uri) if uri else settings.folder
    if folder is None:
        raise ModelLoadError(f"model '{settings.name}' names no uri and has no folder")
    if folder.is_file() and folder.name in DETECTOR_FILES:
        folder = folder.parent
    if not any((folder / name).is_file() for name in DETECTOR_FILES):
        raise ModelLoadError(
            f"{folder} is not an alibi-detect detector folder (no config.toml or meta.dill: "
            "write one with alibi_detect.saving.save_detector)"
        )
    return folder


def updated_by_predict(detector: Any) -> bool:
    """Whether ``detector.predict`` changes the detector (beyond an online detector's
    ``save_state``-able state): its answers then depend on the requests before."""
    if type(detector).__name__ in UPDATED_BY_PREDICT:
        return True
    # MMDDrift, LSDDDrift... hold their backend's detector, which holds the setting.
    inner = getattr(detector, "_detector", detector)
    if any(isinstance(getattr(inner, name, None), dict) for name in UPDATE_SETTINGS):
        return True
    # ClassifierDrift, LearnedKernelDrift: a model trained on from the previous predict's.
    return getattr(inner, "retrain_from_scratch", True) is False


def is_tensor(value: Any) -> bool:
    """Whether a value of a detector's ``data`` is numbers a tensor holds: not None (an
    IForest's ``feature_score``), nor an object (ClassifierDrift's trained ``model``)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.dtype != object
    return isinstance(value, bool | int | float | list | tuple)


def check_predict_parameters(detector: Any, parameters: Mapping[str, Any]) -> None:
    """A ModelLoadError unless the detector's ``predict`` takes ``parameters`` as keyword
    arguments: else every request would fail alike (MLServer loads such a model and answers
    each request with the TypeError)."""
    signature = inspect.signature(detector.predict)
    try:
        signature.bind_partial(None, **parameters)  # None: the rows, its first argument
    except TypeError as error:
        takes = [
            name
            for name, parameter in list(signature.parameters.items())[1:]
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        ]
        raise ModelLoadError(
            f"parameters.extra.predict_parameters does not fit {type(detector).__name__}"
            f".predict ({error}; it takes {', '.join(takes) or 'none'})"
        ) from None


def _mapping(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ModelLoadError(f"parameters.extra.{name} must be an object, not {value!r}")
    return value


def _positive(value: Any, name: str, default: int | None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadError(
            f"parameters.extra.{name} must be a whole number above 0, not {value!r}"
        )
    return value
