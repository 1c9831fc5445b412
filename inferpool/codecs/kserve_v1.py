"""KServe's V1 protocol as a codec: its ``instances`` to a V2 request shaped by the
model's metadata, and a V2 response to its ``{"predictions": [...]}`` (or the model's
attributions to ``{"explanations": {...}}``).

So any model answers KServe's V1 clients through the ordinary inference path in the
workers. What KServe's sklearn, xgboost and lightgbm servers accept is accepted here:

- rows of numbers (``[[5.1, 3.5, 1.4, 0.2], ...]``): one tensor ``[rows, width]`` in the
  datatype of the model's one input, or one column per input when it has several;
- objects (``[{"a": 1, "b": 2}, ...]``, or KServe's ``[{"a": [1, 3], "b": [2, 4]}]`` and
  ``[[{"a": 1, "b": 2}, ...]]``): a table, its columns in the order the model's
  ``feature_names`` give (LightGBM's server reads them so), else as written; one tensor
  per input when the model has an input per column;
- strings: one BYTES tensor, for a model that reads text.

A prediction is one entry per row: a ``[rows, 1]`` output flattened, as the libraries'
``predict`` return it; several outputs give one object per row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from inferpool.codecs.base import bytes_tensor
from inferpool.codecs.mlflow_scoring import jsonable
from inferpool.codecs.pandas import is_pandas
from inferpool.codecs.registry import decode_response
from inferpool.errors import BadRequest
from inferpool.protocol.datatypes import cast_checked
from inferpool.protocol.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

Spec = dict[str, Any]  # an input of the model's metadata: name, datatype, shape, parameters


def to_request(
    rows: list[Any], inputs: list[Spec], outputs: list[str] | None = None
) -> InferenceRequest:
    """The V2 request of ``rows`` (a V1 body's ``instances``) for a model whose metadata
    lists ``inputs``; a 400 saying what does not fit."""
    if not inputs:
        raise BadRequest("the model declares no inputs to read V1 instances into")
    first = rows[0]
    if isinstance(first, dict) or (isinstance(first, list) and first and _all_dicts(first)):
        tensors = _table_tensors(_table(rows), inputs)
    elif isinstance(first, str):
        tensors = [_text_tensor(rows, inputs)]
    else:
        tensors = _row_tensors(rows, inputs)
    requested = [RequestedOutput(name) for name in outputs or ()]
    return InferenceRequest(tensors, outputs=requested)


def predictions(response: InferenceResponse, positive: bool = False) -> bytes:
    """``{"predictions": [...]}``: one entry per row; ``positive``: two class
    probabilities a row answered as the second's alone (a binary Booster's ``predict``)."""
    result = decode_response(response.outputs, response.parameters.get("content_type"))
    if is_pandas(result, "DataFrame"):
        value: Any = result.to_dict(orient="records")
    elif len(result) == 1:
        value = _per_row(next(iter(result.values())), positive)
    else:  # one object per row, as KServe writes a table
        columns = {name: _per_row(values) for name, values in result.items()}
        count = min(len(values) for values in columns.values())
        value = [{name: values[i] for name, values in columns.items()} for i in range(count)]
    return orjson.dumps({"predictions": value}, default=jsonable)


def explanations(response: InferenceResponse) -> bytes:
    """``{"explanations": {"contributions": [...], ...}}``: the attributions of each row
    and what they explain (``runtimes/explain.py``: score, feature and class names)."""
    (tensor,) = response.outputs
    document = {tensor.name: np.asarray(tensor.data).tolist(), **tensor.parameters}
    return orjson.dumps({"explanations": document}, default=jsonable)


def _per_row(values: Any, positive: bool = False) -> list[Any]:
    array = np.asarray(values)
    if positive and array.ndim == 2 and array.shape[1] == 2:
        array = array[:, 1]
    if array.ndim == 2 and array.shape[1] == 1:  # booster.predict's one score per row
        array = array[:, 0]
    if array.dtype.kind in "OS":
        return [jsonable(v) if isinstance(v, bytes) else v for v in array.tolist()]
    return array.tolist()  # type: ignore[no-any-return]


# -- rows of numbers ------------------------------------------------------------------------
def _row_tensors(rows: list[Any], inputs: list[Spec]) -> list[Tensor]:
    if len(inputs) == 1:
        try:
            array = np.asarray(rows)
        except ValueError:
            raise BadRequest("instances: every instance must have the same length") from None
        if array.dtype.kind not in "biuf":
            raise BadRequest("instances: rows must hold numbers only (or be objects or strings)")
        return [_tensor(inputs[0], array, _width(inputs[0]))]
    # An input per column: each column read alone, so that it keeps its own type.
    for row in rows:
        if not isinstance(row, list) or len(row) != len(inputs):
            raise BadRequest(
                f"instances: the model has {len(inputs)} inputs ({_described(inputs)}): each "
                f"instance must hold {len(inputs)} values, not "
                f"{len(row) if isinstance(row, list) else 1}"
            )
    return [_column(spec, _values([row[j] for row in rows])) for j, spec in enumerate(inputs)]


def _values(column: list[Any]) -> np.ndarray:
    """A column's values; with any text among them as objects (numpy would turn numbers
    beside text into text)."""
    if any(isinstance(value, str) for value in column):
        return np.array(column, dtype=object)
    return np.asarray(column)


def _width(spec: Spec) -> int | None:
    shape = spec.get("shape") or []
    return shape[1] if len(shape) == 2 and shape[1] > 0 else None


def _tensor(spec: Spec, array: np.ndarray, width: int | None) -> Tensor:
    name, datatype = spec["name"], spec["datatype"]
    if width is not None and (array.ndim != 2 or array.shape[1] != width):
        found: object = array.shape[1] if array.ndim == 2 else "a single value"
        if array.ndim > 2:
            found = f"instances of {array.ndim - 1} dimensions"
        raise BadRequest(
            f"instances: the model expects {width} values per instance (input '{name}'), "
            f"got {found}"
        )
    if datatype == "BYTES":
        raise BadRequest(f"instances: input '{name}' takes strings, not numbers")
    return Tensor(name, datatype, array.shape, cast_checked(array, datatype, name))


def _column(spec: Spec, values: np.ndarray) -> Tensor:
    """One input of a model with an input per column: ``[rows]`` or ``[rows, 1]`` as its
    metadata's shape has it."""
    shape = spec.get("shape") or [-1]
    column = values.reshape(-1, 1) if len(shape) == 2 else values.reshape(-1)
    if spec["datatype"] == "BYTES" or column.dtype.kind in "OU":
        if column.dtype.kind not in "OU" or not all(isinstance(v, str) for v in values.tolist()):
            raise BadRequest(f"instances: column '{spec['name']}' must hold strings only")
        encoded = [str(v).encode() for v in column.reshape(-1).tolist()]
        return bytes_tensor(spec["name"], encoded, column.shape, "str")
    name, datatype = spec["name"], spec["datatype"]
    return Tensor(name, datatype, column.shape, cast_checked(column, datatype, name))


# -- strings --------------------------------------------------------------------------------
def _text_tensor(rows: list[Any], inputs: list[Spec]) -> Tensor:
    """Strings for a model of one input (a text pipeline's metadata may say FP64 [-1, -1],
    as it cannot tell): BYTES ``[rows]`` with content type ``str``."""
    if not all(isinstance(row, str) for row in rows):
        raise BadRequest("instances: mixing strings with other values")
    if len(inputs) != 1:
        raise BadRequest(
            f"instances: strings fit a model of one input; this one takes {_described(inputs)}"
        )
    # One string a row, as KServe hands a list of strings to ``predict``.
    return bytes_tensor(inputs[0]["name"], [row.encode() for row in rows], (len(rows),), "str")


def _described(inputs: list[Spec]) -> str:
    return ", ".join(f"{spec['name']} ({spec['datatype']})" for spec in inputs)


# -- objects --------------------------------------------------------------------------------
def _table(rows: list[Any]) -> Any:
    """The table of object instances, as KServe concatenates them (one frame each)."""
    import pandas as pd

    frames = []
    for row in rows:
        if isinstance(row, dict) and not any(isinstance(v, list) for v in row.values()):
            row = [row]  # one record: KServe needs lists here, a record is plainly one row
        if not (isinstance(row, dict) or (isinstance(row, list) and _all_dicts(row))):
            raise BadRequest("instances: mixing objects with other values")
        try:
            frames.append(pd.DataFrame(row))
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"instances: cannot read the objects as a table ({exc})") from None
    return pd.concat(frames, axis=0, ignore_index=True)


def _all_dicts(items: list[Any]) -> bool:
    return all(isinstance(item, dict) for item in items)


def _table_tensors(table: Any, inputs: list[Spec]) -> list[Tensor]:
    columns = [str(c) for c in table.columns]
    table.columns = columns
    if len(inputs) > 1 or inputs[0]["name"] in columns:  # an input per column
        missing = [spec["name"] for spec in inputs if spec["name"] not in columns]
        if missing:
            raise BadRequest(f"instances: missing column(s) {', '.join(missing)}")
        return [_column(spec, table[spec["name"]].to_numpy()) for spec in inputs]
    spec = inputs[0]
    names = (spec.get("parameters") or {}).get("feature_names")
    if names:
        missing = [name for name in names if name not in columns]
        if missing:
            raise BadRequest(f"instances: missing feature(s) {', '.join(missing)}")
        table = table[list(names)]
    array = table.to_numpy()
    if array.dtype.kind not in "biuf":
        raise BadRequest(f"instances: input '{spec['name']}' takes numbers only")
    return [_tensor(spec, array, _width(spec))]
