"""The R runtime: a model saved with ``saveRDS`` (``model.rds``), predicted by R's own
``predict(model, newdata, type = ...)`` through rpy2, in the worker process.

The inputs are the columns the model was fitted on (``all.vars`` of its terms, or
``parameters.extra.features``): a request sends them as one ``[rows, k]`` tensor in that
order, or as one tensor per column by name. Each column is copied once into an R vector
(R owns its memory) and the columns become the ``newdata`` data.frame. ``predict``'s
answer becomes the output ``predict``: a numeric vector FP64 ``[-1]``, a matrix (class
probabilities) FP64 ``[-1, k]``, a factor (class labels) BYTES ``[-1]``.
``parameters.extra.predict_type`` chooses ``type`` (``response``, ``prob``, ``class``...:
what the model's predict method takes); ``parameters.extra.r_packages`` names R packages
to load first (a model's class named after its package, ``randomForest``, loads it alone).

R is started in the worker, after the fork, at the first load (the registry's entry is
neither preloaded nor fork-safe): embedded R keeps process state (its session's temporary
folder, deleted by whichever process exits first) that forked copies would share. R runs
one call at a time in a process: every R call here holds one lock.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import rpy2  # noqa: F401 - a missing rpy2 is "pip install inferpool[r]" (the registry)

from inferpool.errors import BadRequest, ModelError, ModelLoadError
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes.artefacts import find_artefact
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.load_errors import reading
from inferpool.runtimes.tabular import NUMERIC_KINDS, check_rows

LIBRARY = "R"  # as load errors name it
ARTEFACT_NAMES = ("model.rds",)
OUTPUT = "predict"
LIBRARY_PATH = "LD_LIBRARY_PATH"
# R is one interpreter per process, not reentrant: one call at a time, whatever the model.
R_LOCK = threading.RLock()

# The R side: the model's columns, its output's kind, and predict on a data.frame built
# from the columns without another copy (a list given the data.frame class).
R_HELPERS = """
list(
  features = function(m) {
    t <- tryCatch(stats::terms(m), error = function(e) NULL)
    if (!is.null(t)) return(all.vars(stats::delete.response(t)))
    if (!is.null(m$importance)) return(rownames(m$importance))
    character(0)
  },
  predicts = function(m) {
    any(vapply(class(m), function(c)
      !is.null(utils::getS3method("predict", c, optional = TRUE)), TRUE))
  },
  output = function(m, type) {
    classes <- if (is.null(m$classes)) -1L else length(m$classes)
    if (!is.null(type) && type %in% c("prob", "vote", "votes")) return(c("FP64", classes))
    if (!is.null(m$classes) && (is.null(type) || type %in% c("response", "class")))
      return(c("BYTES", 0L))
    c("FP64", 0L)
  },
  predict = function(m, columns, names, rows, type) {
    names(columns) <- names
    newdata <- structure(columns, class = "data.frame", row.names = c(NA_integer_, -rows))
    p <- if (is.null(type)) stats::predict(m, newdata = newdata)
         else stats::predict(m, newdata = newdata, type = type)
    if (is.factor(p)) return(list(as.character(p), 0L))
    if (is.matrix(p) || is.data.frame(p)) {
      p <- as.matrix(p)
      return(list(as.vector(t(p)), ncol(p)))
    }
    list(as.vector(p), 0L)
  }
)
"""


class RRuntime(Runtime):
    platform = "r"
    accepts = "dict"

    def load(self) -> None:
        path = find_artefact(self, ARTEFACT_NAMES)
        extra = self.settings.parameters.extra
        self.type = extra.get("predict_type")
        with R_LOCK:
            ri, helpers = _start_r()
            self.ri, self.helpers = ri, helpers
            for package in extra.get("r_packages", []):
                _load_package(ri, package, path.name)
            self.model = _read_rds(ri, path)
            self._check_predicts(path.name)
            self.r_type = ri.StrSexpVector([self.type]) if self.type else ri.NULL
            features = extra.get("features") or list(helpers["features"](self.model))
            datatype, width = helpers["output"](self.model, self.r_type)
        if not features:
            raise ModelLoadError(
                f"{path.name}: cannot tell the columns the R model was fitted on "
                "(it has no terms): name them in parameters.extra.features"
            )
        self.features = [str(name) for name in features]
        self.r_names = ri.StrSexpVector(self.features)
        shape = [-1, int(width)] if int(width) != 0 else [-1]
        self.output_spec = TensorSpec(OUTPUT, str(datatype), shape)

    def _check_predicts(self, name: str) -> None:
        """Load the package named as the model's class (``randomForest``) if there is one,
        then refuse a model that no loaded R package predicts, in one sentence."""
        ri = self.ri
        classes = [str(c) for c in ri.baseenv["class"](self.model)]
        for cls in classes:
            _require(ri, cls)
        if not self.helpers["predicts"](self.model)[0]:
            first = classes[0] if classes else "unknown"
            raise ModelLoadError(
                f"{name} holds an R '{first}' model and no R package installed here "
                f"predicts it (install the one that defines predict.{first}, e.g. "
                f"r-cran-{first.lower()} from apt, and name it in parameters.extra.r_packages)"
            )

    def inputs(self) -> list[TensorSpec]:
        return super().inputs() or [TensorSpec(name, "FP64", [-1]) for name in self.features]

    def outputs(self) -> list[TensorSpec]:
        return self.settings.output_specs() or [self.output_spec]

    def predictor(self) -> str:
        return f"R's predict through rpy2 (type {self.type or 'default'})"

    def validate(self, payload: Any) -> None:
        self._columns(payload)

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        from rpy2.rinterface_lib.embedded import RRuntimeError

        columns = self._columns(payload)
        rows = len(columns[0])
        with R_LOCK:
            ri = self.ri
            vectors = ri.ListSexpVector([_r_vector(ri, column) for column in columns])
            try:
                values, width = self.helpers["predict"](
                    self.model, vectors, self.r_names, ri.IntSexpVector([rows]), self.r_type
                )
            except RRuntimeError as exc:
                raise ModelError(f"model '{self.name}' failed in R: {_r_message(exc)}") from None
            result = _from_r(ri, values)
        if result.dtype == object:
            self._refuse_missing(result)
        width = int(width[0])
        answer = result.reshape(rows, width) if width else result
        return {outputs[0] if outputs else OUTPUT: answer}

    def _refuse_missing(self, labels: np.ndarray) -> None:
        """R's NA label (the row had values the model cannot use, such as NaN) has no V2
        encoding: a 400 naming the rows."""
        missing = [i for i, label in enumerate(labels) if not isinstance(label, str)]
        if missing:
            rows = ", ".join(str(i) for i in missing[:10])
            raise BadRequest(
                f"model '{self.name}' predicted NA (R's missing value) for row {rows}: "
                "its input has values the model cannot use (NaN?)"
            )

    def _columns(self, payload: dict[str, Any]) -> list[np.ndarray]:
        """The model's columns from one [rows, k] tensor or from tensors named as them."""
        features = self.features
        if len(payload) == 1 and next(iter(payload)) not in features:
            matrix = np.asarray(next(iter(payload.values())))
            if matrix.ndim != 2 or matrix.shape[1] != len(features):
                raise BadRequest(
                    f"model '{self.name}' expects its {len(features)} columns "
                    f"({', '.join(features)}) as one [rows, {len(features)}] tensor or one "
                    f"tensor each, got shape {list(matrix.shape)}"
                )
            columns = list(matrix.T)
        else:
            missing = [name for name in features if name not in payload]
            if missing:
                raise BadRequest(f"model '{self.name}' is missing input {', '.join(missing)}")
            columns = [np.asarray(payload[name]).reshape(-1) for name in features]
        check_rows(self.name, len(columns[0]))
        if len({len(column) for column in columns}) > 1:
            raise BadRequest(f"model '{self.name}': its inputs have different numbers of rows")
        return columns


def _start_r() -> tuple[Any, Any]:
    """rpy2's R, started in this process on the first call (the caller holds R_LOCK), and
    the helper functions; one sentence when R cannot start."""
    # rpy2 puts R's library folders first in LD_LIBRARY_PATH for R's own children; every
    # later child of this process would inherit them (a Python child then loads the
    # system's libpython in place of its own): the variable is put back as it was.
    saved = os.environ.get(LIBRARY_PATH)
    try:
        import rpy2.rinterface as ri

        with warnings.catch_warnings():
            # Started off the main thread (``--workers 0`` loads in a thread), rpy2 warns
            # that R's SIGINT handler cannot be undone: R installs none (rpy2 sets
            # R_SignalHandlers = 0), and Python's own handler still runs (checked).
            warnings.filterwarnings("ignore", "R is not initialized by the main thread")
            ri.initr_simple()
    except Exception as exc:
        raise ModelLoadError(
            f"R cannot be started here ({type(exc).__name__}: {exc}): install R "
            "(apt-get install r-base-core) and rpy2 built against it"
        ) from None
    finally:
        if saved is None:
            os.environ.pop(LIBRARY_PATH, None)
        else:
            os.environ[LIBRARY_PATH] = saved
    global _HELPERS
    if _HELPERS is None:
        helpers = ri.evalr(R_HELPERS)
        _HELPERS = dict(zip(helpers.names, helpers, strict=True))
    return ri, _HELPERS


_HELPERS: dict[str, Any] | None = None


def _require(ri: Any, package: str) -> bool:
    """Load the R package's namespace if it is installed; whether it is."""
    found = ri.baseenv["requireNamespace"](ri.StrSexpVector([package]), quietly=True)
    return bool(found[0])


def _load_package(ri: Any, package: str, name: str) -> None:
    if not _require(ri, package):
        raise ModelLoadError(
            f"{name} needs the R package '{package}', which is not installed "
            f"(install.packages('{package}'), or r-cran-{package.lower()} from apt)"
        )


def _r_vector(ri: Any, column: np.ndarray) -> Any:
    """A column as an R vector: numbers as doubles (one copy), anything else as strings."""
    if column.dtype.kind in NUMERIC_KINDS:
        contiguous = np.ascontiguousarray(column, dtype=np.float64)
        return ri.FloatSexpVector.from_memoryview(contiguous.data)
    values = [v.decode() if isinstance(v, bytes) else str(v) for v in column.tolist()]
    return ri.StrSexpVector(values)


def _from_r(ri: Any, values: Any) -> np.ndarray:
    """An R vector as a NumPy array of its own (R may free the vector afterwards)."""
    if isinstance(values, ri.FloatSexpVector):
        return np.array(values.memoryview(), dtype=np.float64)
    if isinstance(values, ri.IntSexpVector):
        return np.array(values.memoryview(), dtype=np.int32)
    if isinstance(values, ri.BoolSexpVector):
        return np.array(list(values), dtype=bool)
    # NA_character_ stays a non-str object (``_refuse_missing``).
    return np.array([v if isinstance(v, str) else None for v in values], dtype=object)


def _read_rds(ri: Any, path: Path) -> Any:
    """``readRDS(path)``, or the sentence for a file R cannot read."""
    from rpy2.rinterface_lib.embedded import RRuntimeError

    with reading(path, LIBRARY):
        try:
            return ri.baseenv["readRDS"](ri.StrSexpVector([str(path)]))
        except RRuntimeError as exc:
            raise ModelLoadError(
                f"{path.name} is not a valid R model ({_r_message(exc)}; "
                "the file may be truncated or corrupt)"
            ) from None


# R's "Error in f(x) : " before its message: the call says nothing to a client.
_R_CALL = re.compile(r"^Error in .*? :\s+|^Error:\s+", re.DOTALL)


def _r_message(exc: Exception) -> str:
    text = " ".join(_R_CALL.sub("", str(exc).strip(), count=1).split())
    return text or type(exc).__name__
