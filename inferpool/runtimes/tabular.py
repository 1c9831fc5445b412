"""What runtimes of tabular models share: checking a payload against the model's features,
and turning class probabilities into labels.

A payload is an ndarray (rows × features) or, when the request asked for ``pd`` or the
model was fitted on named columns, a DataFrame whose columns must be the model's features.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferpool.errors import BadRequest

NUMERIC_KINDS = "biuf"


def is_dataframe(payload: Any) -> bool:
    # Duck-typed so that modules which never see a DataFrame need not import pandas.
    return hasattr(payload, "columns") and hasattr(payload, "iloc")


def numeric_matrix(payload: Any, n_features: int) -> np.ndarray | None:
    """An array or DataFrame payload of numbers in ``n_features`` columns as a 2-D array
    (as it is: no copy, no cast), or None when it is anything else."""
    if is_dataframe(payload):
        if any(dtype.kind not in NUMERIC_KINDS for dtype in payload.dtypes):
            return None
        payload = payload.to_numpy()
    if not isinstance(payload, np.ndarray) or payload.dtype.kind not in NUMERIC_KINDS:
        return None
    if payload.ndim != 2 or payload.shape[1] != n_features:
        return None
    return payload


def check_matrix(model: str, payload: Any, n_features: int, numeric: bool = True) -> np.ndarray:
    """A 2-D array of ``n_features`` columns, or a 400 that says what was expected."""
    array = np.asarray(payload)
    if array.ndim != 2:
        raise BadRequest(
            f"model '{model}' expects a 2-D input [rows, {n_features}], "
            f"got shape {list(array.shape)}"
        )
    if array.shape[1] != n_features:
        raise BadRequest(f"model '{model}' expects {n_features} features, got {array.shape[1]}")
    check_rows(model, array.shape[0])
    if numeric and array.dtype.kind not in NUMERIC_KINDS:
        raise BadRequest(f"model '{model}' expects numeric features, got {array.dtype} data")
    return array


def check_rows(model: str, rows: int) -> None:
    """A 400 for an input with no rows: no library predicts on an empty table alike."""
    if rows == 0:
        raise BadRequest(f"model '{model}' needs at least one row, got 0")


def check_finite(model: str, array: np.ndarray, allow_nan: bool) -> None:
    """A 400 for NaN (unless ``allow_nan``) or infinity in a float matrix, as
    scikit-learn's own input check refuses them; other dtypes have neither."""
    if array.dtype.kind != "f":
        return
    if allow_nan:
        if np.isinf(array).any():
            raise BadRequest(f"model '{model}' cannot take infinite values")
    elif not np.isfinite(array).all():
        raise BadRequest(f"model '{model}' cannot take NaN or infinite values")


def columns_in_order(model: str, frame: Any, names: Sequence[str]) -> Any:
    """``frame`` with exactly the model's feature columns, in the model's order.

    An unknown or a missing column is a 400 naming what the model expects.
    """
    present = [str(c) for c in frame.columns]
    expected = set(names)
    unknown = [c for c in present if c not in expected]
    if unknown:
        raise BadRequest(
            f"model '{model}' has no input {', '.join(repr(c) for c in unknown)}; "
            f"expected: {', '.join(names)}"
        )
    missing = [n for n in names if n not in set(present)]
    if missing:
        raise BadRequest(
            f"model '{model}' is missing input {', '.join(repr(n) for n in missing)}; "
            f"expected: {', '.join(names)}"
        )
    if present == list(names):
        return frame
    return frame[list(names)]


def features_matrix(model: str, payload: Any, names: Sequence[str]) -> np.ndarray:
    """The rows × features matrix of an array or DataFrame payload, columns in model order."""
    if is_dataframe(payload):
        frame = columns_in_order(model, payload, names)
        non_numeric = [str(c) for c, t in frame.dtypes.items() if t.kind not in NUMERIC_KINDS]
        if non_numeric:
            raise BadRequest(
                f"model '{model}' expects numeric features; not numeric: {', '.join(non_numeric)}"
            )
        check_rows(model, len(frame))
        matrix: np.ndarray = frame.to_numpy()
        return matrix
    return check_matrix(model, payload, len(names))


def labels_from_probabilities(probabilities: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The most probable class of each row (the first one on a tie, as scikit-learn does)."""
    labels: np.ndarray = classes[np.argmax(probabilities, axis=1)]
    return labels


def two_class_probabilities(positive: np.ndarray) -> np.ndarray:
    """[P(class 0), P(class 1)] per row from a binary model's P(class 1)."""
    positive = np.asarray(positive).reshape(-1)
    return np.column_stack([1.0 - positive, positive])
