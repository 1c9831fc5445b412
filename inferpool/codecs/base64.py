"""The ``base64`` codec: BYTES elements holding base64 text, decoded to raw ``bytes``."""

from __future__ import annotations

import base64
import binascii
from typing import Any

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


def _from_base64(item: bytes) -> bytes:
    return base64.b64decode(item, validate=True)


class Base64Codec(InputCodec):
    content_types = ("base64",)

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        return isinstance(value, bytes) or (
            isinstance(value, list | tuple) and all_instances(value, bytes)
        )

    @classmethod
    def decode(cls, tensor: Tensor) -> Any:
        """``bytes`` for shape [], a list of ``bytes`` for one dimension, else an ndarray."""
        require_bytes(tensor, "base64")
        values = convert_elements(tensor, _from_base64, "valid base64", (binascii.Error,))
        return shaped(values, tensor.shape)

    @classmethod
    def encode(cls, name: str, value: Any) -> Tensor:
        items, shape = flat_elements(value)
        return bytes_tensor(name, [base64.b64encode(item) for item in items], shape, "base64")
