"""``base64``: a list of bytes sent base64-encoded in a BYTES tensor, and back."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from inferpool.mlserver.codecs.base import register_input_codec
from inferpool.mlserver.codecs.elements import ElementCodec


def _as_bytes(elem: Any) -> bytes:
    return elem.encode("ascii") if isinstance(elem, str) else bytes(elem)


@register_input_codec
class Base64Codec(ElementCodec):
    """A list of bytes, base64-encoded on the wire, as a ``[N, 1]`` BYTES tensor."""

    ContentType = "base64"
    TypeHint = list[bytes]
    ItemType = bytes

    @classmethod
    def encode_item(cls, item: Any, use_bytes: bool) -> bytes | str:
        encoded = base64.b64encode(_as_bytes(item))
        return encoded if use_bytes else encoded.decode("ascii")

    @classmethod
    def decode_item(cls, element: Any) -> bytes:
        raw = _as_bytes(element)
        try:
            return base64.b64decode(raw, validate=True)
        except binascii.Error:
            return raw  # not base64: taken as the bytes themselves, as MLServer does
