"""Two servers' answers compared output by output (inferpool's beside MLServer's, in
tests/mlserver and tests/environments): each output's name, datatype and shape equal, its
data equal, numbers within a tolerance."""

from __future__ import annotations

import math

import numpy as np


def assert_same_data(ours: object, theirs: object, rtol: float = 1e-6, atol: float = 0.0) -> None:
    """Two tensors' data: equal, numbers within ``rtol``/``atol`` (NaN, JSON's null, equal
    to NaN)."""
    if _numbers(ours) and _numbers(theirs):
        np.testing.assert_allclose(
            _floats(ours), _floats(theirs), rtol=rtol, atol=atol, equal_nan=True
        )
    else:
        assert ours == theirs


def assert_same_outputs(
    ours: list[dict], theirs: list[dict], skip: tuple = (), atol: float = 0.0
) -> None:
    """Each output's name, datatype, shape and data equal; those in ``skip`` (drawn anew by
    each load: an online detector's simulated thresholds) by their name, datatype and shape."""
    assert [o["name"] for o in ours] == [t["name"] for t in theirs]
    for one, other in zip(ours, theirs, strict=True):
        head = ("name", "datatype", "shape")
        assert [one[k] for k in head] == [other[k] for k in head], (one, other)
        if one["name"] not in skip:
            assert_same_data(one["data"], other["data"], atol=atol)


def _flat(data: object) -> list:
    if isinstance(data, list):
        return [value for item in data for value in _flat(item)]
    return [data]


def _numbers(data: object) -> bool:
    return all(v is None or isinstance(v, int | float) for v in _flat(data))


def _floats(data: object) -> list[float]:
    return [math.nan if v is None else float(v) for v in _flat(data)]
