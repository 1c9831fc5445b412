"""The ``datetime`` codec: BYTES elements holding ISO-8601 text, as numpy datetime64.

Times without an offset keep the precision their text carries; times with an offset
(``Z``, ``+02:00``) are converted to UTC, since datetime64 holds no time zone. In a
``pd`` request a datetime column is a pandas datetime column (Timestamps).
"""

from __future__ import annotations

import datetime as dt
import warnings
from typing import Any

import numpy as np

from inferpool.codecs.base import (
    InputCodec,
    all_instances,
    bytes_tensor,
    convert_elements,
    flat_elements,
    require_bytes,
)
from inferpool.codecs.string import decode_utf8
from inferpool.errors import BadRequest
from inferpool.protocol.types import Tensor


class DatetimeCodec(InputCodec):
    content_types = ("datetime",)

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        if isinstance(value, np.ndarray):
            return bool(value.dtype.kind == "M")
        if isinstance(value, np.datetime64 | dt.datetime):
            return True
        return isinstance(value, list | tuple) and all_instances(value, dt.datetime)

    @classmethod
    def decode(cls, tensor: Tensor) -> np.ndarray:
        """A datetime64 ndarray of the declared shape (a datetime64 scalar for shape [])."""
        require_bytes(tensor, "datetime")
        texts = convert_elements(tensor, decode_utf8, "valid UTF-8", (UnicodeDecodeError,))
        values = parse_datetimes(texts, tensor.name).reshape(tensor.shape)
        return values[()] if values.ndim == 0 else values

    @classmethod
    def encode(cls, name: str, value: Any) -> Tensor:
        array = _as_datetime64(value)
        texts = np.datetime_as_string(array.reshape(-1)).tolist()
        return bytes_tensor(name, [t.encode() for t in texts], array.shape, "datetime")


def parse_datetimes(texts: list[str], name: str) -> np.ndarray:
    """ISO-8601 texts as a flat datetime64 array; a 400 names the first bad element."""
    try:
        with warnings.catch_warnings():
            # numpy warns (and would drop it) on an offset: take the UTC path instead.
            warnings.simplefilter("error")
            parsed = np.array(texts, dtype="datetime64")
    except (ValueError, UserWarning, DeprecationWarning):
        return _parse_in_utc(texts, name)
    if np.datetime_data(parsed.dtype)[0] == "generic":
        # Only NaT (or nothing) carries no unit: give the one pandas uses.
        return parsed.astype("M8[ns]")
    return parsed


def _parse_in_utc(texts: list[str], name: str) -> np.ndarray:
    import pandas as pd

    try:
        parsed = pd.to_datetime(texts, format="ISO8601", utc=True)
    except (ValueError, OverflowError):
        for index, text in enumerate(texts):
            try:
                pd.to_datetime([text], format="ISO8601", utc=True)
            except (ValueError, OverflowError):
                raise BadRequest(
                    f"input '{name}': element {index} ({text[:40]!r}) is not an ISO-8601 datetime"
                ) from None
        raise
    utc: np.ndarray = parsed.tz_convert(None).to_numpy()
    # pandas 2 parses to nanoseconds, pandas 3 to microseconds when the texts need no finer
    # unit: one request must decode to the same dtype on both (.tolist() gives datetimes
    # for microseconds, integers for nanoseconds).
    micro = utc.astype("M8[us]")
    if np.array_equal(micro.astype(utc.dtype).view("i8"), utc.view("i8")):
        return micro
    return utc


def _as_datetime64(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.datetime64):
        return np.asarray(value)
    import pandas as pd

    # Python datetimes, possibly with a time zone: UTC, as the decoder gives them back.
    items, shape = flat_elements(value)
    index = pd.to_datetime(items, utc=True).tz_convert(None)
    array: np.ndarray = index.to_numpy().reshape(shape)
    return array
