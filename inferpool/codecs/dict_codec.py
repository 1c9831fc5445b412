"""The ``dict`` request codec: every input decoded by its own codec, keyed by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inferpool.codecs.base import RequestCodec
from inferpool.protocol.types import Tensor


class DictCodec(RequestCodec):
    content_types = ("dict",)

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        # A mapping returned as one output's value: its items become the outputs.
        return isinstance(value, Mapping)

    @classmethod
    def decode(cls, tensors: Sequence[Tensor], default_content_types: dict[str, str]) -> dict:
        from inferpool.codecs.registry import decode_input

        return {t.name: decode_input(t, default_content_types.get(t.name)) for t in tensors}

    @classmethod
    def encode(cls, value: Mapping[str, Any]) -> list[Tensor]:
        from inferpool.codecs.registry import encode_output

        return [encode_output(str(name), item) for name, item in value.items()]
