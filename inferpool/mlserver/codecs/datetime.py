"""``datetime``: a list of datetimes as ISO 8601 strings in a BYTES tensor, and back."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from inferpool.mlserver.codecs.base import InputCodec, register_input_codec
from inferpool.mlserver.codecs.lists import as_list, is_list_of
from inferpool.mlserver.types import Parameters, RequestInput, ResponseOutput


def _encode(elem: str | datetime, use_bytes: bool) -> bytes | str:
    iso = elem if isinstance(elem, str) else elem.isoformat()  # a string is ISO already
    return iso.encode("ascii") if use_bytes else iso


def _decode(elem: Any) -> datetime:
    return datetime.fromisoformat(elem if isinstance(elem, str) else elem.decode("ascii"))


@register_input_codec
class DatetimeCodec(InputCodec):
    """A list of datetimes as a ``[N, 1]`` BYTES tensor of ISO 8601 strings."""

    ContentType = "datetime"
    TypeHint = list[str | datetime]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return is_list_of(payload, datetime)

    @classmethod
    def encode_output(
        cls, name: str, payload: list[str | datetime], use_bytes: bool = True, **kwargs: Any
    ) -> ResponseOutput:
        return ResponseOutput(
            name=name,
            datatype="BYTES",
            shape=[len(payload), 1],
            data=[_encode(item, use_bytes) for item in payload],
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> list[datetime]:
        return [_decode(item) for item in as_list(response_output.data.root)]

    @classmethod
    def encode_input(
        cls, name: str, payload: list[str | datetime], use_bytes: bool = True, **kwargs: Any
    ) -> RequestInput:
        return RequestInput(**dict(cls.encode_output(name, payload, use_bytes=use_bytes)))

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[datetime]:
        return [_decode(item) for item in as_list(request_input.data.root)]
