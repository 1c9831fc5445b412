"""``str``: a list of Python strings as a BYTES tensor (UTF-8), and back."""

from __future__ import annotations

from typing import Any

from inferpool.mlserver.codecs.base import InputCodec, register_input_codec, register_request_codec
from inferpool.mlserver.codecs.lists import as_list, is_list_of
from inferpool.mlserver.codecs.utils import InputOrOutput, SingleInputRequestCodec
from inferpool.mlserver.types import Parameters, RequestInput, ResponseOutput


def encode_str(elem: str) -> bytes:
    return elem.encode("utf-8")


def decode_str(encoded: Any, str_codec: str = "utf-8") -> Any:
    """An element as a string: bytes decoded, a string (from JSON) kept, None kept."""
    if encoded is None or isinstance(encoded, str):
        return encoded
    if isinstance(encoded, bytes):
        return encoded.decode(str_codec)
    return ""


def _decode(tensor: InputOrOutput) -> list[str]:
    return [decode_str(item) for item in as_list(tensor.data.root)]


@register_input_codec
class StringCodec(InputCodec):
    """A list of strings as a ``[N, 1]`` BYTES tensor."""

    ContentType = "str"
    TypeHint = list[str]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return is_list_of(payload, str)

    @classmethod
    def encode_output(
        cls, name: str, payload: list[str], use_bytes: bool = True, **kwargs: Any
    ) -> ResponseOutput:
        data = [encode_str(item) for item in payload] if use_bytes else list(payload)
        return ResponseOutput(
            name=name,
            datatype="BYTES",
            shape=[len(payload), 1],
            data=data,
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> list[str]:
        return _decode(response_output)

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[str]:
        return _decode(request_input)

    @classmethod
    def encode_input(
        cls, name: str, payload: list[str], use_bytes: bool = True, **kwargs: Any
    ) -> RequestInput:
        output = cls.encode_output(name, payload, use_bytes)
        return RequestInput(**dict(output))


@register_request_codec
class StringRequestCodec(SingleInputRequestCodec):
    """A request (response) whose one input (output) is a list of strings."""

    InputCodec = StringCodec
    ContentType = StringCodec.ContentType
    TypeHint = list[str]
