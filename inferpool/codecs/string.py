"""The ``str`` codec: BYTES tensors as UTF-8 strings, shaped as declared."""

from __future__ import annotations

from typing import Any

import numpy as np

from inferpool.codecs.base import InputCodec
from inferpool.errors import BadRequest
from inferpool.protocol.types import Tensor


class StringCodec(InputCodec):
    content_types = ("str", "string")

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)

    @classmethod
    def decode(cls, tensor: Tensor) -> np.ndarray:
        if tensor.datatype != "BYTES":
            raise BadRequest(f"input '{tensor.name}': content type 'str' needs BYTES data")
        flat = tensor.data.reshape(-1)
        out = np.empty(flat.shape, dtype=object)
        for i, item in enumerate(flat):
            try:
                out[i] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
            except UnicodeDecodeError:
                raise BadRequest(f"input '{tensor.name}': element {i} is not valid UTF-8") from None
        return out.reshape(tensor.shape)

    @classmethod
    def encode(cls, name: str, value: Any) -> Tensor:
        items = list(np.asarray(value, dtype=object).reshape(-1))
        data = np.array([str(item).encode("utf-8") for item in items], dtype=object)
        shape = np.shape(value) if isinstance(value, np.ndarray) else (len(items),)
        return Tensor(name, "BYTES", tuple(shape), data.reshape(shape), {"content_type": "str"})
