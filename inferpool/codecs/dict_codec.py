"""The ``dict`` request codec: every input decoded by its own codec, keyed by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inferpool.codecs.base import RequestCodec, TensorDecoder, TensorEncoder
from inferpool.protocol.types import Tensor


class DictCodec(RequestCodec):
    content_types = ("dict",)

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        # A mapping returned as one output's value: its items become the outputs.
        return isinstance(value, Mapping)

    @classmethod
    def decode(
        cls,
        tensors: Sequence[Tensor],
        default_content_types: dict[str, str],
        decode_input: TensorDecoder,
    ) -> dict[str, Any]:
        return {t.name: decode_input(t, default_content_types.get(t.name)) for t in tensors}

    @classmethod
    def encode(cls, value: Mapping[str, Any], encode_output: TensorEncoder) -> list[Tensor]:
        return [encode_output(str(name), item) for name, item in value.items()]
