"""Finds the codec for a content type (aliases included) or for a value to encode."""

from __future__ import annotations

from typing import Any

from inferpool.codecs.base import InputCodec
from inferpool.codecs.numpy import NumpyCodec
from inferpool.codecs.string import StringCodec
from inferpool.errors import BadRequest
from inferpool.protocol.types import Tensor

# Order matters for encoding: the first codec that can encode a value wins.
INPUT_CODECS: list[type[InputCodec]] = [NumpyCodec, StringCodec]
_BY_CONTENT_TYPE = {ct: codec for codec in INPUT_CODECS for ct in codec.content_types}


def find_input_codec(content_type: str, where: str) -> type[InputCodec]:
    try:
        return _BY_CONTENT_TYPE[content_type]
    except (KeyError, TypeError):
        known = ", ".join(codec.content_type() for codec in INPUT_CODECS)
        raise BadRequest(
            f"{where}: unknown content type {content_type!r}; expected one of {known}"
        ) from None


def decode_input(tensor: Tensor, default_content_type: str | None = None) -> Any:
    """Decode one input by its own content type, else the model's default, else ``np``."""
    content_type = tensor.content_type or default_content_type
    if content_type is None:
        return tensor.data
    return find_input_codec(content_type, f"input '{tensor.name}'").decode(tensor)


def encode_output(name: str, value: Any) -> Tensor:
    """Encode a value a runtime returned as one output tensor."""
    if isinstance(value, Tensor):
        return value
    for codec in INPUT_CODECS:
        if codec.can_encode(value):
            return codec.encode(name, value)
    return NumpyCodec.encode(name, value)
