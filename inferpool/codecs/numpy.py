"""The ``np`` codec: a tensor as a numpy ndarray of the declared shape (the default).

Decoding hands over the tensor's array itself (for binary tensors, a view of the request
body); BYTES stay an object array of ``bytes``, as over every wire format.
"""

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
        if not isinstance(value, np.ndarray):
            return False
        if value.dtype.kind == "O":
            return all(isinstance(item, bytes) for item in value.reshape(-1).tolist())
        return value.dtype.kind in "biufS"

    @classmethod
    def decode(cls, tensor: Tensor) -> np.ndarray:
        return tensor.data

    @classmethod
    def encode(cls, name: str, value: Any) -> Tensor:
        array = np.asarray(value)
        if array.dtype.byteorder == ">":
            # The wire is little-endian; so is every array the engine hands on.
            array = array.astype(array.dtype.newbyteorder("<"))
        datatype = datatype_of(array)
        if datatype == "BYTES" and array.dtype.kind != "O":
            array = array.astype(object)
        return Tensor(name, datatype, array.shape, array, {"content_type": "np"})
