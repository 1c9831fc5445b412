"""MLflow's scoring protocol (``POST /invocations``) as a codec: its request bodies to a V2
request, and a V2 response to its ``{"predictions": ...}`` answer.

So any model answers MLflow's scoring clients through the ordinary inference path in the
workers. A JSON body holds exactly one of ``dataframe_split``, ``dataframe_records``,
``instances`` or ``inputs`` (and optionally ``params``, which only an MLflow pyfunc takes:
its runtime serves JSON with its own endpoint); a CSV body is a table with a header row,
as ``pandas.DataFrame.to_csv`` writes it. A table becomes one input per column; an
unnamed array one input, ``input-0``; named arrays one input each.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import orjson

from inferpool.codecs.base import bytes_tensor
from inferpool.codecs.pandas import is_pandas
from inferpool.codecs.registry import decode_response, encode_output
from inferpool.errors import BadRequest, InferpoolError
from inferpool.protocol.mlflow_endpoints import INVOCATIONS, INVOCATIONS_CSV, scoring_document
from inferpool.protocol.types import InferenceRequest, InferenceResponse, Tensor

UNNAMED = "input-0"

# Runs one V2 request through a model's whole inference path (the worker's ``infer``).
Infer = Callable[[InferenceRequest], InferenceResponse]
Endpoint = Callable[[bytes], Any]


def scoring_endpoint(name: str, endpoints: Mapping[str, Endpoint], infer: Infer) -> Endpoint | None:
    """The endpoint ``name`` answers for a model whose runtime has none of that name
    among its own ``endpoints``.

    A runtime with its own JSON ``invocations`` (an MLflow pyfunc) gets a CSV body as the
    same table in JSON, so it answers both as MLflow does.
    """
    if name == INVOCATIONS:
        return lambda body: predictions(infer(from_json(body)))
    if name != INVOCATIONS_CSV:
        return None
    own = endpoints.get(INVOCATIONS)
    if own is not None:
        return lambda body: own(csv_as_json(body))
    return lambda body: predictions(infer(_frame_request(read_csv(body))))


def from_json(body: bytes) -> InferenceRequest:
    """A V2 request from MLflow's JSON scoring body."""
    key, value, _ = scoring_document(body)  # params: only a pyfunc's own endpoint takes them
    try:
        if key == "dataframe_split":
            return _frame_request(_split_frame(value))
        if key == "dataframe_records" or _records(value):
            return _frame_request(_frame(value))
        return _tensor_request(value)
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"invocations: cannot read {key} ({_first_line(exc)})") from None


def read_csv(body: bytes) -> Any:
    """The table of a CSV body with a header row (UTF-8), as MLflow reads one."""
    import pandas as pd

    try:
        return pd.read_csv(io.StringIO(body.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, pd.errors.ParserError) as exc:
        raise BadRequest(f"invocations: cannot read the CSV body ({_first_line(exc)})") from None


def csv_as_json(body: bytes) -> bytes:
    """A CSV body as MLflow's JSON ``dataframe_split`` of the same table."""
    split = read_csv(body).to_dict(orient="split")
    del split["index"]
    return orjson.dumps({"dataframe_split": split}, default=jsonable)


def predictions(response: InferenceResponse) -> bytes:
    """``{"predictions": ...}``: a table as records, one output as its values, several as
    an object of them (as MLflow writes a DataFrame, an array and a dict)."""
    result = decode_response(response.outputs, response.parameters.get("content_type"))
    if is_pandas(result, "DataFrame"):
        value: Any = result.to_dict(orient="records")
    elif len(result) == 1:
        value = next(iter(result.values()))
    else:
        value = result
    return orjson.dumps({"predictions": value}, default=jsonable)


def jsonable(value: Any) -> Any:
    """orjson's fallback for what it cannot write: arrays as lists, bytes as text, numpy
    scalars as Python's."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write a {type(value).__name__} as JSON")


def _records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _split_frame(value: Any) -> Any:
    if not isinstance(value, dict) or "data" not in value:
        raise ValueError("expected an object with 'data' and optionally 'columns', 'index'")
    unknown = set(value) - {"columns", "data", "index"}
    if unknown:
        raise ValueError(f"unexpected member(s) {', '.join(sorted(unknown))}")
    return _frame(value["data"], value.get("columns"), value.get("index"))


def _frame(data: Any, columns: Any = None, index: Any = None) -> Any:
    import pandas as pd

    if not isinstance(data, list):
        raise ValueError("expected a list of rows")
    return pd.DataFrame(data=data, columns=columns, index=index)


def _frame_request(table: Any) -> InferenceRequest:
    return InferenceRequest([_tensor(str(name), table[name].to_numpy()) for name in table.columns])


def _tensor_request(value: Any) -> InferenceRequest:
    if isinstance(value, dict):
        return InferenceRequest([_tensor(str(k), np.asarray(v)) for k, v in value.items()])
    return InferenceRequest([_tensor(UNNAMED, np.asarray(value))])


def _tensor(name: str, array: np.ndarray) -> Tensor:
    """One input; text as UTF-8 ``str`` elements, anything else as the numpy codec has it."""
    if array.dtype.kind == "U" or (
        array.dtype.kind == "O" and all(isinstance(v, str) for v in array.reshape(-1).tolist())
    ):
        elements = [str(v).encode() for v in array.reshape(-1).tolist()]
        return bytes_tensor(name, elements, array.shape, "str")
    try:
        return encode_output(name, array)
    except InferpoolError:
        raise ValueError(f"column '{name}' holds values of mixed or unsupported types") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
