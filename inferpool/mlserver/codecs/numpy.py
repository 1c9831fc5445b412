"""``np``: a tensor as a NumPy array of its datatype and shape, and back.

The datatype ↔ dtype table is inferpool's (``inferpool.protocol.datatypes``), except for
BYTES, which MLServer decodes as fixed-size ``bytes`` (``str`` for JSON strings).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from inferpool.mlserver.codecs.base import InputCodec, register_input_codec, register_request_codec
from inferpool.mlserver.codecs.lists import is_list_of
from inferpool.mlserver.codecs.string import encode_str
from inferpool.mlserver.codecs.utils import (
    InputOrOutput,
    SingleInputRequestCodec,
    inject_batch_dimension,
)
from inferpool.mlserver.types import Datatype, Parameters, RequestInput, ResponseOutput
from inferpool.protocol.datatypes import NUMPY_BY_DATATYPE, datatype_of


def _datatype_name(datatype: Any) -> str:
    return datatype.value if isinstance(datatype, Datatype) else str(datatype)


def to_dtype(tensor: InputOrOutput) -> np.dtype:
    """The dtype of a tensor's elements; BYTES: ``str`` for strings, else ``S<last dim>``."""
    datatype = _datatype_name(tensor.datatype)
    if datatype != "BYTES":
        return NUMPY_BY_DATATYPE[datatype]
    if is_list_of(tensor.data.root, str):
        return np.dtype(str)
    return np.dtype((np.bytes_, tensor.shape[-1]))


def to_datatype(dtype: Any) -> Datatype:
    """The datatype that carries ``dtype``: strings, bytes and objects are BYTES."""
    dtype = np.dtype(dtype) if not hasattr(dtype, "kind") else dtype
    if dtype.kind in "OSUT":
        return Datatype.BYTES
    return Datatype(datatype_of(np.empty(0, dtype)))


def _to_ndarray(tensor: InputOrOutput) -> np.ndarray:
    data = tensor.data.root
    dtype = to_dtype(tensor)
    if _datatype_name(tensor.datatype) == "BYTES" and is_list_of(data, bytes):
        # Each element is a buffer of fixed-size strings (one per row when sent from gRPC).
        return np.concatenate([np.frombuffer(buffer, dtype) for buffer in data])
    return np.array(data, dtype)


def convert_nan(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def _encode_data(data: np.ndarray, datatype: Datatype) -> list[Any]:
    if datatype == Datatype.BYTES:
        if data.dtype.kind == "U":
            return [encode_str(item) for item in data.flatten().tolist()]
        if data.dtype.kind == "S":
            return [data.tobytes()]
        return list(data.flatten().tolist())
    values = data.flatten().tolist()
    if data.dtype.kind == "f" and np.isnan(data).any():
        values = [convert_nan(value) for value in values]  # JSON has no NaN: null
    return values


@register_input_codec
class NumpyCodec(InputCodec):
    """A tensor as a NumPy array of its shape."""

    ContentType = "np"
    TypeHint = np.ndarray

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return isinstance(payload, np.ndarray)

    @classmethod
    def encode_output(cls, name: str, payload: np.ndarray, **kwargs: Any) -> ResponseOutput:
        datatype = to_datatype(payload.dtype)
        return ResponseOutput(
            name=name,
            datatype=datatype,
            shape=inject_batch_dimension(list(payload.shape)),
            data=_encode_data(payload, datatype),
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> np.ndarray:
        return _to_ndarray(response_output).reshape(response_output.shape)

    @classmethod
    def encode_input(cls, name: str, payload: np.ndarray, **kwargs: Any) -> RequestInput:
        return RequestInput(**dict(cls.encode_output(name, payload)))

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> np.ndarray:
        return _to_ndarray(request_input).reshape(request_input.shape)


@register_request_codec
class NumpyRequestCodec(SingleInputRequestCodec):
    """A request (response) whose one input (output) is a NumPy array."""

    InputCodec = NumpyCodec
    ContentType = NumpyCodec.ContentType
