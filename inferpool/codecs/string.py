"""The ``str`` codec: BYTES tensors as UTF-8 strings, in the declared shape."""

from __future__ import annotations

from typing import Any

import numpy as np

from inferpool.codecs.base import (
    InputCodec,
    all_instances,
    bytes_tensor,
    convert_elements,
    flat_elements,
    require_bytes,
    shaped,
)
from inferpool.protocol.types import Tensor


def decode_utf8(item: bytes) -> str:
    return item.decode("utf-8")


class StringCodec(InputCodec):
    content_types = ("str", "string")

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        if isinstance(value, str):
            return True
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "U":
                return True
            return value.dtype.kind == "O" and all_instances(value.reshape(-1).tolist(), str)
        return isinstance(value, list | tuple) and all_instances(value, str)

    @classmethod
    def decode(cls, tensor: Tensor) -> Any:
        """A str for shape [], a list of str for one dimension, else an object ndarray."""
        require_bytes(tensor, "str")
        values = convert_elements(tensor, decode_utf8, "valid UTF-8", (UnicodeDecodeError,))
        return shaped(values, tensor.shape)

    @classmethod
    def encode(cls, name: str, value: Any) -> Tensor:
        items, shape = flat_elements(value)
        return bytes_tensor(name, [item.encode("utf-8") for item in items], shape, "str")
