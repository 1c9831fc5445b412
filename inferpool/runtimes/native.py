"""The native runtime: a C or C++ shared library (``model.so``) exporting inferpool's C ABI
(``docs/native/inferpool_model.h``), loaded with ctypes and called on the request's own
buffer.

The library declares one input (``[-1, cols]``) and one output (``[-1]`` or ``[-1, k]``) in
the JSON its ``inferpool_model_metadata`` returns, with the datatypes its predict takes.
A request's array is handed over as it is (its ``ctypes.data`` pointer: no copy) when it
is C-contiguous and of a datatype the library accepts; else it is converted once. The
output is an array this runtime allocates and the library fills. Return codes map to 400
(``INFERPOOL_BAD_INPUT``) and 500 (anything else), with the library's own message.

Not fork-safe (the registry's entry): the library's init may start threads or open
files, which a fork would not carry over, so each worker loads it after the fork. Its code
pages are file-backed, so the workers share them through the page cache all the same.
ctypes releases the GIL during each call. A library whose metadata does not say
``"thread_safe": true`` is called under a lock.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from inferpool.errors import BadRequest, ModelError, ModelLoadError
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes.artefacts import find_artefact
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.load_errors import reading
from inferpool.runtimes.tabular import check_matrix

LIBRARY = "native"  # as load errors name it
ABI_VERSION = 1
ARTEFACT_NAMES = ("model.so",)
# The ABI's dtype codes (INFERPOOL_FP32...) by V2 datatype, and their NumPy types.
DTYPE_CODES = {"FP32": 1, "FP64": 2, "INT32": 3, "INT64": 4}
NUMPY_TYPES = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64}
BAD_INPUT = 1  # INFERPOOL_BAD_INPUT; any other non-zero code is a model failure
ERROR_BYTES = 1024  # the message buffer each call hands the library
REQUIRED = ("inferpool_abi_version", "inferpool_model_metadata", "inferpool_model_predict")
HEADER = "docs/native/inferpool_model.h"

# Libraries this process has opened, by real path. dlopen returns the handle it already
# has for a path, globals and all: a second model of the same file (or a reload, which
# loads the new copy before dropping the old one) gets a private copy of the file instead.
_OPENED: set[Path] = set()
_OPENED_LOCK = threading.Lock()


class NativeRuntime(Runtime):
    platform = "native"

    def load(self) -> None:
        path = find_artefact(self, ARTEFACT_NAMES)
        # Announced to the load probe and the template, so that a library whose init
        # crashes its process is blamed on its file (``load_errors.reading``).
        with reading(path, LIBRARY):
            self._load(path)

    def _load(self, path: Path) -> None:
        self.library = _open(path)
        name = path.name
        missing = [symbol for symbol in REQUIRED if not hasattr(self.library, symbol)]
        if missing:
            raise ModelLoadError(
                f"{name} does not export {', '.join(missing)} (the native ABI: {HEADER})"
            )
        self.library.inferpool_abi_version.restype = ctypes.c_int
        version = self.library.inferpool_abi_version()
        if version != ABI_VERSION:
            raise ModelLoadError(
                f"{name} was built for inferpool's native ABI {version}, "
                f"this server speaks ABI {ABI_VERSION}"
            )
        self._init(name)
        self._describe(name, _metadata(self.library, name))
        predict = self.library.inferpool_model_predict
        predict.restype = ctypes.c_int
        predict.argtypes = (
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_char_p,
            ctypes.c_size_t,
        )
        self._predict = predict
        self.path = path

    def _init(self, name: str) -> None:
        """Call the library's optional ``inferpool_model_init`` with the model's folder."""
        init = getattr(self.library, "inferpool_model_init", None)
        if init is None:
            return
        init.restype = ctypes.c_int
        init.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t)
        folder = str(self.settings.folder or ".").encode()
        error = ctypes.create_string_buffer(ERROR_BYTES)
        if init(folder, error, ERROR_BYTES) != 0:
            raise ModelLoadError(f"{name} failed to initialise: {_message(error, 'no message')}")

    def _describe(self, name: str, document: dict[str, Any]) -> None:
        """Read the model's input, output and flags from its metadata document."""
        try:
            (given,) = document["inputs"]
            (answer,) = document["outputs"]
            self.input_spec = TensorSpec.from_dict(given)
            self.output_spec = TensorSpec.from_dict(answer)
            accepted = document.get("input_datatypes") or [self.input_spec.datatype]
            self.codes = {datatype: DTYPE_CODES[datatype] for datatype in accepted}
            self.preferred = NUMPY_TYPES[accepted[0]]
            self.output_type = NUMPY_TYPES[self.output_spec.datatype]
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(
                f"{name}'s metadata does not describe one input and one output of "
                f"FP32/FP64/INT32/INT64 ({type(exc).__name__}: {exc}; see {HEADER})"
            ) from None
        shape = self.input_spec.shape
        self.cols = shape[1] if len(shape) == 2 and shape[1] > 0 else None
        per_row = self.output_spec.shape[1:]
        if any(dimension <= 0 for dimension in per_row) or len(per_row) > 1:
            raise ModelLoadError(
                f"{name}'s output shape {self.output_spec.shape} is not [-1] or [-1, k]"
            )
        self.per_row = per_row[0] if per_row else 0  # 0: one value per row, a 1-D output
        self.rows_independent = document.get("rows_independent") is True
        self.thread_safe = document.get("thread_safe") is True
        self.lock = nullcontext() if self.thread_safe else threading.Lock()

    def inputs(self) -> list[TensorSpec]:
        return super().inputs() or [self.input_spec]

    def outputs(self) -> list[TensorSpec]:
        return self.settings.output_specs() or [self.output_spec]

    def predictor(self) -> str:
        calls = "reentrant" if self.thread_safe else "calls serialised"
        return f"native library {self.path.name} ({calls})"

    def native_bytes(self) -> int:
        # The library's code and data (a compiled tree model is mostly that); what its
        # init allocates is not known here.
        return self.path.stat().st_size

    def validate(self, payload: Any) -> None:
        if self.cols is not None:
            check_matrix(self.name, payload, self.cols)

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        array = self._as_input(payload)
        rows, cols = array.shape
        width = self.per_row or 1
        result = np.empty((rows, self.per_row) if self.per_row else rows, self.output_type)
        error = ctypes.create_string_buffer(ERROR_BYTES)
        code = self.codes[_DATATYPES[array.dtype.type]]
        with self.lock:
            status = self._predict(
                array.ctypes.data,
                rows,
                cols,
                code,
                result.ctypes.data,
                rows * width,
                error,
                ERROR_BYTES,
            )
        if status == BAD_INPUT:
            detail = _message(error, "the library refused it")
            raise BadRequest(f"model '{self.name}' rejected its input: {detail}")
        if status != 0:
            detail = _message(error, f"code {status}")
            raise ModelError(f"model '{self.name}' failed: {detail}")
        return {outputs[0] if outputs else self.output_spec.name: result}

    def _as_input(self, payload: Any) -> np.ndarray:
        """The payload as the library reads it: the request's own buffer when it is
        C-contiguous and of a datatype the library takes, else converted once."""
        array = payload if isinstance(payload, np.ndarray) else np.asarray(payload)
        if array.ndim == 1 and self.cols == 1:
            array = array.reshape(-1, 1)  # a view
        array = check_matrix(self.name, array, self.cols or _columns(array))
        if _DATATYPES.get(array.dtype.type) not in self.codes:
            return np.ascontiguousarray(array, self.preferred)
        return np.ascontiguousarray(array)  # the same array when it already is

    def unload(self) -> None:
        release = getattr(self.library, "inferpool_model_free", None)
        if release is not None:
            release.restype = None
            with self.lock:
                release()


_DATATYPES = {numpy_type: datatype for datatype, numpy_type in NUMPY_TYPES.items()}


def _columns(array: np.ndarray) -> int:
    return array.shape[1] if array.ndim == 2 else -1


def _open(path: Path) -> ctypes.CDLL:
    """dlopen ``path`` (a private copy when this process already opened it), or say why not."""
    real = path.resolve()
    with _OPENED_LOCK:
        target = _private_copy(real) if real in _OPENED else real
        try:
            library = ctypes.CDLL(str(target), mode=ctypes.RTLD_LOCAL)
        except OSError as exc:
            reason = str(exc).replace(str(target), path.name)
            message = f"{path.name} cannot be loaded as a shared library: {reason}"
            raise ModelLoadError(message) from None
        finally:
            if target != real:
                shutil.rmtree(target.parent, ignore_errors=True)  # mapped: still loaded
        _OPENED.add(real)
    return library


def _private_copy(path: Path) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="inferpool-native-"))
    return Path(shutil.copy2(path, folder / path.name))


def _metadata(library: ctypes.CDLL, name: str) -> dict[str, Any]:
    """The JSON object the library's ``inferpool_model_metadata`` returns."""
    function = library.inferpool_model_metadata
    function.restype = ctypes.c_int
    function.argtypes = (ctypes.POINTER(ctypes.c_char_p),)
    text = ctypes.c_char_p()
    status = function(ctypes.byref(text))
    if status != 0 or not text.value:
        raise ModelLoadError(f"{name}'s inferpool_model_metadata returned {status} and no JSON")
    try:
        document = json.loads(text.value)
    except ValueError as exc:
        raise ModelLoadError(f"{name}'s metadata is not valid JSON ({exc})") from None
    if not isinstance(document, dict):
        raise ModelLoadError(f"{name}'s metadata is not a JSON object")
    return document


def _message(error: ctypes.Array[ctypes.c_char], default: str) -> str:
    text = error.value.decode("utf-8", "replace").strip()
    return text.splitlines()[0] if text else default
