"""The ``json`` and ``pd_json`` codecs: BYTES elements each holding one JSON document, as
Python objects.

``pd_json`` is MLServer's label for a DataFrame column of JSON documents: one document per
element, whatever the tensor's shape, as a flat list (a column).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from inferpool.codecs.base import (
    InputCodec,
    all_instances,
    bytes_tensor,
    convert_elements,
    flat_elements,
    require_bytes,
    shaped,
)
from inferpool.protocol import limits
from inferpool.protocol.rest_json import nested_deeper
from inferpool.protocol.types import Tensor

_DUMP_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def _load(element: bytes) -> Any:
    """One document, nested no deeper than ``max_json_depth`` (orjson stops at 1024)."""
    document = orjson.loads(element)
    if (type(document) is dict or type(document) is list) and nested_deeper(
        document, limits.current().max_json_depth
    ):
        raise ValueError(f"nested deeper than {limits.current().max_json_depth} (max_json_depth)")
    return document


class JsonCodec(InputCodec):
    content_types = ("json",)

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        """A dict (one document), a list of dicts, or an object ndarray of documents."""
        if isinstance(value, dict):
            return True
        if isinstance(value, np.ndarray):
            return bool(value.dtype.kind == "O")
        return isinstance(value, list | tuple) and all_instances(value, dict)

    @classmethod
    def decode(cls, tensor: Tensor) -> Any:
        """The document for shape [], a list of documents for one dimension, else an ndarray."""
        require_bytes(tensor, "json")
        values = convert_elements(tensor, _load, "valid JSON", (ValueError,))
        return shaped(values, tensor.shape)

    @classmethod
    def encode(cls, name: str, value: Any) -> Tensor:
        items, shape = flat_elements(value)
        documents = [orjson.dumps(item, option=_DUMP_OPTIONS) for item in items]
        return bytes_tensor(name, documents, shape, "json")


class PandasJsonCodec(InputCodec):
    content_types = ("pd_json",)

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        return False  # a value of documents is encoded by JsonCodec, the general one

    @classmethod
    def decode(cls, tensor: Tensor) -> list[Any]:
        """Every element's document, flat: one column value per element."""
        require_bytes(tensor, "pd_json")
        return convert_elements(tensor, _load, "valid JSON", (ValueError,))

    @classmethod
    def encode(cls, name: str, value: Any) -> Tensor:
        items, _ = flat_elements(value)
        documents = [orjson.dumps(item, option=_DUMP_OPTIONS) for item in items]
        return bytes_tensor(name, documents, (len(documents),), "pd_json")
