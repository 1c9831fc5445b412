"""The codec interfaces (stateless classes keyed by content type) and their shared helpers.

An input codec turns one tensor into a Python object and back; a request codec turns all
the inputs of a request (or all the outputs of a response) into one object and back.

The codec modules import this module, never the registry: a request codec is handed the
registry's per-tensor functions as arguments (``TensorDecoder``, ``TensorEncoder``), so the
registry can import every codec module and no codec module imports it back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from inferpool.errors import BadRequest
from inferpool.protocol.types import Tensor

#: Decodes one tensor by its own content type, else the given default (the registry's
#: ``decode_input``).
TensorDecoder = Callable[[Tensor, str | None], Any]
#: Encodes one named value as an output tensor with the codec that fits it (the registry's
#: ``encode_output``).
TensorEncoder = Callable[[str, Any], Tensor]


class Codec:
    """What every codec shares: the content types it answers to, and what it can encode.

    ``content_types`` names the canonical content type first, then the aliases in the wild.
    """

    content_types: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def content_type(cls) -> str:
        return cls.content_types[0]

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        raise NotImplementedError


class InputCodec(Codec):
    """Converts one tensor to a Python object (decode) and one object to a tensor (encode)."""

    @classmethod
    def decode(cls, tensor: Tensor) -> Any:
        raise NotImplementedError

    @classmethod
    def encode(cls, name: str, value: Any) -> Tensor:
        raise NotImplementedError


class RequestCodec(Codec):
    """Converts every tensor of a request or response to one object, and back.

    Each tensor is decoded, and each part of the object encoded, by the function passed in
    (``decode_input``, ``encode_output``), which picks that tensor's own input codec.
    """

    @classmethod
    def decode(
        cls,
        tensors: Sequence[Tensor],
        default_content_types: dict[str, str],
        decode_input: TensorDecoder,
    ) -> Any:
        raise NotImplementedError

    @classmethod
    def encode(cls, value: Any, encode_output: TensorEncoder) -> list[Tensor]:
        raise NotImplementedError


def require_bytes(tensor: Tensor, content_type: str) -> None:
    if tensor.datatype != "BYTES":
        raise BadRequest(
            f"input '{tensor.name}': content type '{content_type}' needs BYTES data, "
            f"got {tensor.datatype}"
        )


def convert_elements(
    tensor: Tensor,
    convert: Callable[[bytes], Any],
    problem: str,
    errors: tuple[type[Exception], ...],
) -> list[Any]:
    """``convert`` applied to each BYTES element, row-major; a 400 names the first bad one."""
    out = []
    for index, item in enumerate(tensor.data.reshape(-1).tolist()):
        try:
            out.append(convert(item))
        except errors as exc:
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BadRequest(
                f"input '{tensor.name}': element {index} is not {problem} ({detail})"
            ) from None
    return out


def shaped(values: list[Any], shape: Sequence[int]) -> Any:
    """Decoded elements in the declared shape: a scalar for shape [], a list for one
    dimension (what text pipelines take), an object ndarray for more."""
    if len(shape) == 0:
        return values[0]
    if len(shape) == 1:
        return values
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(tuple(shape))


def flat_elements(value: Any) -> tuple[list[Any], tuple[int, ...]]:
    """A scalar, list or ndarray of Python objects as a flat list and its shape."""
    if isinstance(value, np.ndarray):
        return value.reshape(-1).tolist(), value.shape
    if isinstance(value, list | tuple):
        return list(value), (len(value),)
    return [value], ()


def bytes_tensor(
    name: str, elements: list[bytes], shape: tuple[int, ...], content_type: str
) -> Tensor:
    """A BYTES tensor of already-encoded elements, shaped and labelled."""
    data = np.empty(len(elements), dtype=object)
    data[:] = elements
    return Tensor(name, "BYTES", shape, data.reshape(shape), {"content_type": content_type})


def all_instances(items: Any, kind: type | tuple[type, ...]) -> bool:
    """A non-empty sequence whose items are all ``kind`` (an empty one says nothing)."""
    return len(items) > 0 and all(isinstance(item, kind) for item in items)
