"""The ``pmml`` runtime: a PMML document (``model.pmml``, or the ``.pmml`` file that
``parameters.uri`` names) evaluated by JPMML-Evaluator (``jpmml_evaluator``, whose jars
come with it) in this process's JVM (``jvm.py``, shared with the ``java`` runtime).

The metadata is the document's: one ``[-1]`` input per input field of its mining schema
(named as in its data dictionary), one ``[-1]`` output per target field and per output
field (a classifier's ``probability(<class>)`` each), typed from their PMML data types.
A request gives the inputs by name, or one ``[rows, fields]`` tensor whose columns are
the input fields in order. The rows go to the evaluator's own batch call
(``PythonEvaluatorUtil.evaluateAll``: what ``Evaluator.evaluateAll`` does, without
building DataFrames), so the answers are the evaluator's. A value the document refuses
(a category it does not know, a missing value it does not allow) is a 400 naming the row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jpype
import numpy as np
from jpmml_evaluator import PythonEvaluatorUtil, make_evaluator

from inferpool.errors import BadRequest, ModelError, ModelLoadError
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes import jvm
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.load_errors import reading

LIBRARY = "PMML"  # as load errors name it
ARTEFACT = "model.pmml"
# PMML data types as V2 datatypes; any other (dates, times) travels as text.
DATATYPES = {
    "double": "FP64",
    "float": "FP32",
    "integer": "INT64",
    "boolean": "BOOL",
    "string": "BYTES",
}
NUMPY_TYPES = {"FP64": np.float64, "FP32": np.float32, "INT64": np.int64, "BOOL": np.bool_}
MAX_REASON = 300  # characters of the evaluator's reason kept in a load error
SEQUENTIAL = 1  # rows evaluated on the calling thread: the workers are the parallelism


class PMMLRuntime(Runtime):
    platform = "pmml"
    accepts = "dict"

    def load(self) -> None:
        self.path = self._artefact()
        # Only the file is read here: the load probe stops at the end of this block,
        # before a JVM would start in its short-lived process.
        with reading(self.path, LIBRARY), self.path.open("rb") as file:
            head = file.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
            if not head.startswith(b"<"):
                raise ModelLoadError(f"{self.path.name} is not a valid PMML model (not XML)")
        heap = self.settings.parameters.extra.get("jvm_heap")
        jvm.ensure_started(None if heap is None else str(heap))
        try:
            self.evaluator = make_evaluator(str(self.path), backend="jpype").verify()
        except Exception as exc:
            raise ModelLoadError(
                f"{self.path.name} is not a valid PMML model ({_reason(exc)})"
            ) from None
        self.fields = [_spec(field) for field in self.evaluator.getInputFields()]
        results = self.evaluator.getTargetFields() + self.evaluator.getOutputFields()
        self.results = [_spec(field) for field in results]
        self.names = [spec.name for spec in self.fields]

    def _artefact(self) -> Path:
        """The ``.pmml`` that ``uri`` names (a file or a folder), else the model folder's."""
        settings = self.settings
        folder = settings.resolve(settings.parameters.uri) if settings.parameters.uri else None
        if folder is not None and not folder.is_dir():
            if not folder.is_file():
                raise ModelLoadError(f"PMML file {folder} does not exist")
            return folder
        folder = folder or settings.folder
        if folder is None:
            raise ModelLoadError(f"model '{self.name}' names no uri and has no folder")
        found = (
            [folder / ARTEFACT] if (folder / ARTEFACT).is_file() else sorted(folder.glob("*.pmml"))
        )
        if len(found) != 1:
            what = "no" if not found else "more than one"
            raise ModelLoadError(f"{what} .pmml file in {folder}")
        return found[0]

    def predictor(self) -> str:
        return f"JPMML-Evaluator on Java (JPype), {len(self.fields)} input fields"

    def inputs(self) -> list[TensorSpec]:
        return super().inputs() or self.fields

    def outputs(self) -> list[TensorSpec]:
        return self.settings.output_specs() or self.results

    def default_outputs(self) -> list[str]:
        return [spec.name for spec in self.results]

    def validate(self, payload: Any) -> None:
        self._columns(payload)

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        arguments = {"columns": self.names, "data": self._columns(payload)}
        evaluator = self.evaluator
        try:
            answer = PythonEvaluatorUtil.evaluateAll(
                evaluator.backend, evaluator.javaEvaluator, arguments, None, SEQUENTIAL
            )
        except Exception as exc:
            raise ModelError(f"model '{self.name}' raised {_reason(exc)}") from None
        errors = answer.get("errors")
        if errors is not None:
            row, error = next((i, e) for i, e in enumerate(errors) if e is not None)
            raise BadRequest(f"model '{self.name}' refused row {row}: {_first_line(error)}")
        columns = dict(zip(answer["columns"], answer["data"], strict=True))
        types = {spec.name: spec.datatype for spec in self.results}
        return {name: _array(columns[name], types[name]) for name in outputs if name in columns}

    def _columns(self, payload: Any) -> list[list[Any]]:
        """The input fields' values, column after column, from a payload by name or from
        one tensor whose columns are the fields in order."""
        expected = ", ".join(repr(name) for name in self.names)
        if len(payload) == 1 and not set(payload) & set(self.names):
            (values,) = payload.values()
            values = np.asarray(values)
            rows = values.reshape(len(values), -1) if values.ndim != 2 else values
            if rows.shape[1] != len(self.names):
                raise BadRequest(
                    f"model '{self.name}' takes {len(self.names)} columns ({expected}), "
                    f"got {rows.shape[1]}"
                )
            return [_values(rows[:, i]) for i in range(rows.shape[1])]
        missing = [repr(name) for name in self.names if name not in payload]
        if missing:
            raise BadRequest(
                f"model '{self.name}' is missing input {', '.join(missing)}; expected: {expected}"
            )
        return [_values(np.asarray(payload[name]).reshape(-1)) for name in self.names]


def _spec(field: Any) -> TensorSpec:
    """A PMML field (``jpmml_evaluator.ModelField``) as a ``[-1]`` tensor."""
    data_type = str(field.getDataType())
    return TensorSpec(
        str(field.getName()),
        DATATYPES.get(data_type, "BYTES"),
        [-1],
        {"pmml_data_type": data_type, "pmml_op_type": str(field.getOpType())},
    )


def _values(column: np.ndarray) -> list[Any]:
    """A column as Python values for the evaluator (text for bytes)."""
    if column.dtype.kind in "OS":
        return [v.decode() if isinstance(v, bytes) else v for v in column.tolist()]
    values: list[Any] = column.tolist()
    return values


def _array(values: list[Any], datatype: str) -> np.ndarray:
    """A result column as an array of its V2 datatype (a missing number is NaN)."""
    numpy_type = NUMPY_TYPES.get(datatype)
    if numpy_type is None:
        return np.array(["" if v is None else str(v) for v in values], dtype=object)
    if numpy_type is np.float64 or numpy_type is np.float32:
        return np.array([np.nan if v is None else v for v in values], dtype=numpy_type)
    return np.array(values, dtype=numpy_type)


def _first_line(text: Any) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _reason(exc: BaseException) -> str:
    """The evaluator's reason for an error, on one line (a Java exception's class and
    message; JAXB's linked exception, which says where the document is wrong, included)."""
    if isinstance(exc, jpype.JException):
        text = jvm.java_message(exc)
    else:
        text = " ".join(str(exc).split()) or type(exc).__name__
    cause = getattr(exc, "getLinkedException", None)
    if callable(cause) and cause() is not None:
        text += f": {cause().getMessage()}"
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."
