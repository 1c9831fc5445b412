"""What aggregators and routers compute from tensors: pure numpy, no engine.

An aggregator combines its children's outputs position by position (the first output of
each child, then the second...), under the first child's names: ``concat`` joins them
along an axis, ``mean`` averages them element-wise, ``vote`` takes the label most
children gave per element (a tie goes to the earliest child among those tied). A router
turns a tensor or a request parameter into the key of its branch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferpool.errors import BadRequest, InferpoolError
from inferpool.protocol.datatypes import datatype_of
from inferpool.protocol.types import Tensor


def combine(results: list[list[Tensor]], how: str, axis: int = -1) -> list[Tensor]:
    """The children's outputs (one list per child) combined ``how``."""
    counts = {len(outputs) for outputs in results}
    if len(counts) != 1:
        raise InferpoolError(f"the models answered {sorted(counts)} outputs: they must agree")
    combined = []
    for position, first in enumerate(results[0]):
        column = [outputs[position] for outputs in results]
        if how == "concat":
            data = _concat(column, axis)
        else:
            shapes = {tuple(tensor.data.shape) for tensor in column}
            if len(shapes) != 1:
                raise InferpoolError(
                    f"output '{first.name}': the models answered shapes "
                    f"{sorted(list(s) for s in shapes)}; {how} needs one shape"
                )
            data = _mean(column) if how == "mean" else _vote(column)
        # A mean is new numbers; labels voted or joined keep their content type.
        parameters = {} if how == "mean" else dict(first.parameters)
        combined.append(Tensor(first.name, datatype_of(data), tuple(data.shape), data, parameters))
    return combined


def _concat(column: list[Tensor], axis: int) -> np.ndarray:
    arrays = [tensor.data if tensor.data.ndim else tensor.data.reshape(1) for tensor in column]
    if arrays[0].ndim == 1 and axis in (-1, 1):
        arrays = [array.reshape(-1, 1) for array in arrays]  # one value per row: a column
    try:
        return np.concatenate(arrays, axis=axis)
    except (ValueError, np.exceptions.AxisError) as exc:
        raise InferpoolError(f"output '{column[0].name}': cannot concatenate: {exc}") from None


def _mean(column: list[Tensor]) -> np.ndarray:
    if any(tensor.data.dtype.kind not in "biuf" for tensor in column):
        raise InferpoolError(f"output '{column[0].name}': mean needs numbers")
    stacked = np.stack([tensor.data.astype(np.float64) for tensor in column])
    mean: np.ndarray = stacked.mean(axis=0)
    return mean


def _vote(column: list[Tensor]) -> np.ndarray:
    stacked = np.stack([tensor.data for tensor in column])  # (children, ...)
    labels, codes = np.unique(stacked.reshape(len(column), -1), return_inverse=True)
    codes = codes.reshape(len(column), -1)
    best = codes[0]
    best_count = (codes == best).sum(axis=0)
    for votes in codes[1:]:
        count = (codes == votes).sum(axis=0)
        better = count > best_count  # strictly: a tie keeps the earlier child's label
        best = np.where(better, votes, best)
        best_count = np.where(better, count, best_count)
    voted: np.ndarray = labels[best].reshape(stacked.shape[1:])
    return voted


def route_key(value: Any, rule: str, what: str) -> str:
    """The branch key of a request: its tensor's single value (``value``) or the index
    of its largest element along the last axis (``argmax``), or a parameter's value. A
    request routes as a whole: rows that would choose different branches are a 400."""
    if not isinstance(value, np.ndarray):
        return _key(value)
    if value.size == 0:
        raise BadRequest(f"{what} is empty: no branch can be chosen")
    if rule == "argmax":
        if value.dtype.kind not in "biuf":
            raise BadRequest(f"{what}: argmax needs numbers, got {value.dtype}")
        value = np.argmax(value, axis=-1)
    distinct = np.unique(value.reshape(-1))
    if distinct.size != 1:
        shown = ", ".join(_key(item) for item in distinct[:5].tolist())
        raise BadRequest(
            f"{what} chooses several branches ({shown}): a request is routed as a whole"
        )
    return _key(distinct[0].item() if isinstance(distinct[0], np.generic) else distinct[0])


def _key(value: Any) -> str:
    """A value as branch keys spell it: ``1`` for 1 and 1.0, ``true``, text as it is."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
