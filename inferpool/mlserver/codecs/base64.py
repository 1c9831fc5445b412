"""``base64``: a list of bytes sent base64-encoded in a BYTES tensor, and back."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from inferpool.mlserver.codecs.base import InputCodec, register_input_codec
from inferpool.mlserver.codecs.lists import as_list, is_list_of
from inferpool.mlserver.types import Parameters, RequestInput, ResponseOutput


def _as_bytes(elem: Any) -> bytes:
    return elem.encode("ascii") if isinstance(elem, str) else bytes(elem)


def _encode(elem: Any, use_bytes: bool) -> bytes | str:
    encoded = base64.b64encode(_as_bytes(elem))
    return encoded if use_bytes else encoded.decode("ascii")


def _decode(elem: Any) -> bytes:
    raw = _as_bytes(elem)
    try:
        return base64.b64decode(raw, validate=True)
    except binascii.Error:
        return raw  # not base64: taken as the bytes themselves, as MLServer does


@register_input_codec
class Base64Codec(InputCodec):
    """A list of bytes, base64-encoded on the wire, as a ``[N, 1]`` BYTES tensor."""

    ContentType = "base64"
    TypeHint = list[bytes]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return is_list_of(payload, bytes)

    @classmethod
    def encode_output(
        cls, name: str, payload: list[bytes], use_bytes: bool = True, **kwargs: Any
    ) -> ResponseOutput:
        return ResponseOutput(
            name=name,
            datatype="BYTES",
            shape=[len(payload), 1],
            data=[_encode(item, use_bytes) for item in payload],
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> list[bytes]:
        return [_decode(item) for item in as_list(response_output.data.root)]

    @classmethod
    def encode_input(
        cls, name: str, payload: list[bytes], use_bytes: bool = True, **kwargs: Any
    ) -> RequestInput:
        return RequestInput(**dict(cls.encode_output(name, payload, use_bytes)))

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[bytes]:
        return [_decode(item) for item in as_list(request_input.data.root)]
