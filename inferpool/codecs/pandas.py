"""The ``pd`` request codec: one input per DataFrame column, each decoded by its own codec.

Strict about shape: a column is one value per row (shape ``[rows]`` or ``[rows, 1]``);
an input of shape ``[rows, k]`` becomes ``k`` named sub-columns ``name_0 … name_{k-1}``,
never extra rows; anything deeper is a 400. Columns of unequal length are a 400.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferpool.codecs.base import RequestCodec, TensorDecoder, TensorEncoder
from inferpool.errors import BadRequest
from inferpool.protocol.types import Tensor


def is_pandas(value: Any, kind: str) -> bool:
    """``value`` is a pandas ``kind`` (DataFrame, Series), without importing pandas."""
    cls = type(value)
    return cls.__name__ == kind and cls.__module__.startswith("pandas")


class PandasCodec(RequestCodec):
    content_types = ("pd", "pandas", "dataframe")

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        return is_pandas(value, "DataFrame")

    @classmethod
    def decode(
        cls,
        tensors: Sequence[Tensor],
        default_content_types: dict[str, str],
        decode_input: TensorDecoder,
    ) -> Any:
        columns: dict[str, Any] = {}
        lengths: dict[str, int] = {}
        for tensor in tensors:
            value = decode_input(tensor, default_content_types.get(tensor.name))
            for name, column in _columns(tensor, value):
                columns[name] = column
                lengths[name] = len(column)
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"'{n}' has {rows}" for n, rows in lengths.items())
            raise BadRequest(f"pd request: columns must have the same number of rows: {detail}")
        return frame(columns)

    @classmethod
    def encode(cls, value: Any, encode_output: TensorEncoder) -> list[Tensor]:
        """One output per column, named as the column, with its own content type."""
        return [encode_output(str(name), column_values(value[name])) for name in value.columns]


def frame(columns: dict[str, Any]) -> Any:
    import pandas as pd

    return pd.DataFrame(columns)


def _columns(tensor: Tensor, value: Any) -> list[tuple[str, Any]]:
    """The column(s) one input gives: itself, or its named sub-columns."""
    shape = tensor.shape
    if len(shape) == 0:
        raise BadRequest(f"pd input '{tensor.name}' is a scalar; a column needs a row dimension")
    if len(shape) > 2:
        raise BadRequest(
            f"pd input '{tensor.name}' has shape {list(shape)}; a column is [rows] or "
            "[rows, k] (k named sub-columns)"
        )
    if isinstance(value, list):  # a one-dimensional decoded column (str, base64, json)
        return [(tensor.name, value)]
    array = np.asarray(value)
    if array.ndim == 1:
        return [(tensor.name, array)]
    if array.ndim > 2:  # a codec that adds dimensions (images) cannot make a column
        raise BadRequest(
            f"pd input '{tensor.name}' decodes to shape {list(array.shape)}; a column is "
            "[rows] or [rows, k]"
        )
    if array.shape[1] == 1:
        return [(tensor.name, array[:, 0])]
    return [(f"{tensor.name}_{j}", array[:, j]) for j in range(array.shape[1])]


def column_values(series: Any) -> Any:
    """A column as the value its codec encodes: an ndarray (numeric, bool, datetime;
    objects for the registry to tell bytes from JSON documents) or a list of str."""
    if getattr(series.dtype, "tz", None) is not None:
        return series.dt.tz_convert(None).to_numpy()  # UTC, as the datetime codec reads
    array = series.to_numpy()
    if array.dtype.kind == "O":
        values = array.tolist()
        if values and all(isinstance(v, str) for v in values):
            return values
    return array
