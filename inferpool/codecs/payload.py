"""Request-level decoding: a whole request to the payload a runtime ``accepts``."""

from __future__ import annotations

from typing import Any

import numpy as np

from inferpool.codecs.registry import decode_input
from inferpool.errors import BadRequest
from inferpool.protocol.types import InferenceRequest

# Request-level content types (and aliases) and the payload kind each one asks for.
REQUEST_CONTENT_TYPES = {
    "pd": "dataframe",
    "pandas": "dataframe",
    "dataframe": "dataframe",
    "dict": "dict",
    "np": "array",
    "ndarray": "array",
}


def decode_payload(
    request: InferenceRequest,
    accepts: str,
    default_content_types: dict[str, str],
    column_names: list[str] | None = None,
) -> Any:
    """Decode ``request`` into the runtime's payload kind; the request may override it."""
    content_type = request.content_type
    if content_type is not None:
        try:
            accepts = REQUEST_CONTENT_TYPES[content_type]
        except (KeyError, TypeError):
            known = ", ".join(REQUEST_CONTENT_TYPES)
            raise BadRequest(
                f"unknown request content type {content_type!r}; expected one of {known}"
            ) from None
    if accepts == "request":
        return request
    decoded = {t.name: decode_input(t, default_content_types.get(t.name)) for t in request.inputs}
    if accepts == "dict":
        return decoded
    if accepts == "dataframe":
        return _dataframe(decoded, column_names)
    return _array(decoded)


def _array(decoded: dict[str, Any]) -> Any:
    if len(decoded) == 1:
        return next(iter(decoded.values()))
    # Several inputs side by side, one or more columns each: the same rows, in order.
    columns = [_as_rows(name, np.asarray(value)) for name, value in decoded.items()]
    _check_rows(columns)
    return np.concatenate([c for _, c in columns], axis=1)


def _as_rows(name: str, value: np.ndarray) -> tuple[str, np.ndarray]:
    if value.ndim == 0:
        raise BadRequest(f"input '{name}' is a scalar; inputs need a first (row) dimension")
    return name, value.reshape(value.shape[0], -1)


def _check_rows(columns: list[tuple[str, np.ndarray]]) -> None:
    rows = {name: len(col) for name, col in columns}
    if len(set(rows.values())) > 1:
        detail = ", ".join(f"'{n}' has {r}" for n, r in rows.items())
        raise BadRequest(f"inputs must have the same number of rows: {detail}")


def _dataframe(decoded: dict[str, Any], column_names: list[str] | None):
    import pandas as pd

    if len(decoded) == 1 and column_names:
        ((name, value),) = decoded.items()
        value = np.asarray(value)
        if value.ndim == 2 and value.shape[1] == len(column_names) and name not in column_names:
            return pd.DataFrame(value, columns=column_names)
    columns = [_as_rows(name, np.asarray(value)) for name, value in decoded.items()]
    _check_rows(columns)
    frame = {}
    for name, col in columns:
        if col.shape[1] == 1:
            frame[name] = col[:, 0]
        else:
            # A multi-column input becomes named sub-columns, never extra rows.
            for j in range(col.shape[1]):
                frame[f"{name}_{j}"] = col[:, j]
    return pd.DataFrame(frame)
