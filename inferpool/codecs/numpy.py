"""The ``np`` codec: a tensor as a numpy ndarray of the declared shape (the default)."""

from __future__ import annotations

from typing import Any

import numpy as np

from inferpool.codecs.base import InputCodec
from inferpool.protocol.datatypes import datatype_of
from inferpool.protocol.types import Tensor


class NumpyCodec(InputCodec):
    content_types = ("np", "ndarray", "numpy")

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        return isinstance(value, np.ndarray)

    @classmethod
    def decode(cls, tensor: Tensor) -> np.ndarray:
        return tensor.data

    @classmethod
    def encode(cls, name: str, value: Any) -> Tensor:
        array = np.asarray(value)
        datatype = datatype_of(array)
        if datatype == "BYTES" and array.dtype.kind in "US":
            array = array.astype(object)
        return Tensor(name, datatype, array.shape, array, {"content_type": "np"})
