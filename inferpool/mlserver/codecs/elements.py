"""The shape the element-wise input codecs share (``str``, ``base64``, ``datetime``): a
Python list whose items each become one element of a ``[N, 1]`` BYTES tensor, and back."""

from __future__ import annotations

from typing import Any, ClassVar

from inferpool.mlserver.codecs.base import InputCodec
from inferpool.mlserver.codecs.lists import as_list, is_list_of
from inferpool.mlserver.types import Parameters, RequestInput, ResponseOutput


class ElementCodec(InputCodec):
    """An input codec defined by what one list item becomes on the wire and back."""

    #: the type of the items ``can_encode`` accepts
    ItemType: ClassVar[type | tuple[type, ...]] = object

    @classmethod
    def encode_item(cls, item: Any, use_bytes: bool) -> Any:
        """One item as a tensor element: bytes, or text when ``use_bytes`` is False."""
        raise NotImplementedError()

    @classmethod
    def decode_item(cls, element: Any) -> Any:
        """One tensor element (bytes, or text from JSON) as a list item."""
        raise NotImplementedError()

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return is_list_of(payload, cls.ItemType)

    @classmethod
    def encode_output(
        cls, name: str, payload: list[Any], use_bytes: bool = True, **kwargs: Any
    ) -> ResponseOutput:
        return ResponseOutput(
            name=name,
            datatype="BYTES",
            shape=[len(payload), 1],
            data=[cls.encode_item(item, use_bytes) for item in payload],
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> list[Any]:
        return [cls.decode_item(item) for item in as_list(response_output.data.root)]

    @classmethod
    def encode_input(
        cls, name: str, payload: list[Any], use_bytes: bool = True, **kwargs: Any
    ) -> RequestInput:
        return RequestInput(**dict(cls.encode_output(name, payload, use_bytes)))

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[Any]:
        return [cls.decode_item(item) for item in as_list(request_input.data.root)]
