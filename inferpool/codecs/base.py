"""The codec interfaces: stateless classes keyed by content type."""

from __future__ import annotations

from typing import Any, ClassVar

from inferpool.protocol.types import Tensor


class InputCodec:
    """Converts one tensor to a Python object (decode) and one object to a tensor (encode).

    ``content_types`` names the canonical content type first, then the aliases in the wild.
    """

    content_types: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def content_type(cls) -> str:
        return cls.content_types[0]

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        raise NotImplementedError

    @classmethod
    def decode(cls, tensor: Tensor) -> Any:
        raise NotImplementedError

    @classmethod
    def encode(cls, name: str, value: Any) -> Tensor:
        raise NotImplementedError
