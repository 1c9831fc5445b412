"""``str``: a list of Python strings as a BYTES tensor (UTF-8), and back."""

from __future__ import annotations

from typing import Any

from inferpool.mlserver.codecs.base import register_input_codec, register_request_codec
from inferpool.mlserver.codecs.elements import ElementCodec
from inferpool.mlserver.codecs.utils import SingleInputRequestCodec


def encode_str(elem: str) -> bytes:
    return elem.encode("utf-8")


def decode_str(encoded: Any, str_codec: str = "utf-8") -> Any:
    """An element as a string: bytes decoded, a string (from JSON) kept, None kept."""
    if encoded is None or isinstance(encoded, str):
        return encoded
    if isinstance(encoded, bytes):
        return encoded.decode(str_codec)
    return ""


@register_input_codec
class StringCodec(ElementCodec):
    """A list of strings as a ``[N, 1]`` BYTES tensor."""

    ContentType = "str"
    TypeHint = list[str]
    ItemType = str

    @classmethod
    def encode_item(cls, item: str, use_bytes: bool) -> bytes | str:
        return encode_str(item) if use_bytes else item

    @classmethod
    def decode_item(cls, element: Any) -> Any:
        return decode_str(element)


@register_request_codec
class StringRequestCodec(SingleInputRequestCodec):
    """A request (response) whose one input (output) is a list of strings."""

    InputCodec = StringCodec
    ContentType = StringCodec.ContentType
    TypeHint = list[str]
