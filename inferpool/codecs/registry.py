"""Finds the codec for a content type (aliases included) or for a value to encode, and
decodes and encodes single tensors and whole requests/responses with them.

The one place that assembles the codec tables: it imports every codec module, and no codec
module imports it (a request codec is handed ``decode_input``/``encode_output`` instead),
so the codecs' imports form no cycle (``tests/unit/codecs/test_imports.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from inferpool.codecs.base import InputCodec, RequestCodec
from inferpool.codecs.base64 import Base64Codec
from inferpool.codecs.datetime import DatetimeCodec
from inferpool.codecs.dict_codec import DictCodec
from inferpool.codecs.image import ImageCodec
from inferpool.codecs.json import JsonCodec, PandasJsonCodec
from inferpool.codecs.numpy import NumpyCodec
from inferpool.codecs.pandas import PandasCodec, column_values, is_pandas
from inferpool.codecs.string import StringCodec
from inferpool.errors import BadRequest, ModelError
from inferpool.protocol.types import Tensor

# Order matters for encoding: the first codec that can encode a value wins.
INPUT_CODECS: list[type[InputCodec]] = [
    NumpyCodec,
    DatetimeCodec,
    StringCodec,
    Base64Codec,
    JsonCodec,
    PandasJsonCodec,  # never encodes by value (JsonCodec does): decodes MLServer's pd_json
    ImageCodec,  # never encodes by value: only outputs declared as images are PNG files
]
REQUEST_CODECS: list[type[RequestCodec]] = [PandasCodec, DictCodec]
_BY_CONTENT_TYPE = {ct: codec for codec in INPUT_CODECS for ct in codec.content_types}
_REQUEST_BY_CONTENT_TYPE = {ct: codec for codec in REQUEST_CODECS for ct in codec.content_types}


def _unknown(where: str, content_type: object, known: Iterable[str]) -> BadRequest:
    return BadRequest(
        f"{where}: unknown content type {content_type!r}; expected one of {', '.join(known)}"
    )


def find_input_codec(content_type: str, where: str) -> type[InputCodec]:
    try:
        return _BY_CONTENT_TYPE[content_type]
    except (KeyError, TypeError):
        raise _unknown(where, content_type, _BY_CONTENT_TYPE) from None


def is_input_content_type(content_type: str) -> bool:
    """``content_type`` names an input codec (one tensor), not a request codec."""
    return content_type in _BY_CONTENT_TYPE


def find_request_codec(content_type: str, where: str = "request") -> type[RequestCodec]:
    try:
        return _REQUEST_BY_CONTENT_TYPE[content_type]
    except (KeyError, TypeError):
        raise _unknown(where, content_type, _REQUEST_BY_CONTENT_TYPE) from None


def decode_input(tensor: Tensor, default_content_type: str | None = None) -> Any:
    """Decode one input by its own content type, else the model's default, else ``np``."""
    content_type = tensor.content_type or default_content_type
    if content_type is None:
        return tensor.data
    return find_input_codec(content_type, f"input '{tensor.name}'").decode(tensor)


def encode_output(name: str, value: Any) -> Tensor:
    """Encode one value a runtime returned as one output tensor, labelled with its codec."""
    if isinstance(value, Tensor):
        return value
    if is_pandas(value, "Series"):
        value = column_values(value)  # encoded as the same column of a DataFrame would be
    try:
        for codec in INPUT_CODECS:
            if codec.can_encode(value):
                return codec.encode(name, value)
        return NumpyCodec.encode(name, value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ModelError(
            f"output '{name}': cannot encode a {type(value).__name__} ({exc})"
        ) from None


def encode_outputs(result: Mapping[str, Any]) -> tuple[list[Tensor], str | None]:
    """All outputs of a runtime's result, and the response's content type if it has one.

    A DataFrame becomes one output per column, each with its own content type, and
    labels the response ``pd`` when it is the whole result. A mapping needs no label:
    a response decodes to a dict of outputs by default.
    """
    tensors: list[Tensor] = []
    content_type = None
    for name, value in result.items():
        if PandasCodec.can_encode(value):
            tensors.extend(PandasCodec.encode(value, encode_output))
            if len(result) == 1:
                content_type = PandasCodec.content_type()
        else:
            tensors.append(encode_output(name, value))
    return tensors, content_type


def decode_output(tensor: Tensor) -> Any:
    """Decode one output tensor by the content type it carries (``np`` when it has none)."""
    return decode_input(tensor)


def decode_response(outputs: list[Tensor], content_type: str | None = None) -> Any:
    """The object a runtime returned, from a response's outputs and its content type:
    a DataFrame for ``pd``, else a dict of output name to decoded value."""
    if content_type is None:
        return {tensor.name: decode_output(tensor) for tensor in outputs}
    return find_request_codec(content_type, "response").decode(outputs, {}, decode_input)
