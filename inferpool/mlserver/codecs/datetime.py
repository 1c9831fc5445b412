"""``datetime``: a list of datetimes as ISO 8601 strings in a BYTES tensor, and back."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from inferpool.mlserver.codecs.base import register_input_codec
from inferpool.mlserver.codecs.elements import ElementCodec


@register_input_codec
class DatetimeCodec(ElementCodec):
    """A list of datetimes as a ``[N, 1]`` BYTES tensor of ISO 8601 strings."""

    ContentType = "datetime"
    TypeHint = list[str | datetime]
    ItemType = datetime

    @classmethod
    def encode_item(cls, item: str | datetime, use_bytes: bool) -> bytes | str:
        iso = item if isinstance(item, str) else item.isoformat()  # a string is ISO already
        return iso.encode("ascii") if use_bytes else iso

    @classmethod
    def decode_item(cls, element: Any) -> datetime:
        text = element if isinstance(element, str) else element.decode("ascii")
        return datetime.fromisoformat(text)
