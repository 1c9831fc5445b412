"""The Python side of the JSON tensor scanner (``_jsonscan.c`` and its ``jsonscan/``
headers, one per instruction set): a request body's numeric ``data`` arrays read straight
into numpy buffers, the rest left to orjson.

``scan`` hands back the body's "skeleton" (each array it read replaced by ``0``) and what
it read, by input index. rest_json parses the skeleton with orjson, puts each
``ScannedData`` where its ``0`` is, and decodes the document as it would the whole body's.

Why the outcome is the one the whole body gives (orjson, then numpy):
- The scanner cuts an array out only when it read every token in it, each one orjson
  accepts with the value orjson gives, nested as numpy makes an array of. So orjson
  accepts the skeleton exactly when it accepts the body, and the two documents differ
  only in those arrays. When orjson refuses the skeleton, the whole body is parsed again
  (its error message, or the standard library's NaN/Infinity path, is the body's own).
- A ``ScannedData`` holds what the decoder would make of the array: the flat values of
  the declared datatype, or the number of values when it is not the one the shape needs
  (the decoder's error then). Anything the decoder would refuse otherwise (a value out of
  range, floats for an integer datatype, ragged nesting ...) was left in the skeleton.
- The scanner read the tensor's ``datatype`` and ``shape`` itself; ``values_for`` checks
  them against the document's before using the values (``StaleScan`` if they differ).

Without the extension (no C compiler) ``scan`` returns None: orjson reads everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

from inferpool.errors import BadRequest
from inferpool.protocol.datatypes import NUMPY_BY_DATATYPE
from inferpool.protocol.limits import DecodeLimits

_jsonscan: ModuleType | None
try:
    from inferpool.protocol import _jsonscan
except ImportError:  # built without a C compiler
    _jsonscan = None

AVAILABLE = _jsonscan is not None


class StaleScan(Exception):
    """The scanner's reading of a tensor differs from orjson's: decode the whole body."""


@dataclass(frozen=True, slots=True)
class ScannedData:
    """A tensor's ``data`` as the scanner read it, for the datatype and shape it saw."""

    datatype: str
    shape: tuple[int, ...]
    #: the flat values, or how many the array held when the shape needs another number
    values: np.ndarray | int


def _allocate(count: int, datatype: str) -> np.ndarray:
    return np.empty(count, dtype=NUMPY_BY_DATATYPE[datatype])


def scan(
    body: bytes, current: DecodeLimits, max_ndim: int
) -> tuple[bytes, dict[int, ScannedData]] | None:
    """The skeleton and the data arrays read by input index, or None when none was read.

    What the scanner allocates is bounded as ``admit`` bounds the decoder: no tensor over
    ``max_tensor_elements``, no more than ``max_request_tensor_bytes`` in all.
    """
    if _jsonscan is None:
        return None
    scanned = _jsonscan.scan(
        body,
        _allocate,
        current.max_tensor_elements,
        current.max_request_tensor_bytes,
        max_ndim,
    )
    if scanned is None:
        return None
    skeleton, found = scanned
    return skeleton, {
        index: ScannedData(datatype, shape, values)
        for index, datatype, shape, values, _start, _end in found
    }


def values_for(
    data: ScannedData, datatype: str, shape: tuple[int, ...], expected: int, name: str
) -> np.ndarray:
    """The tensor's values shaped as declared, or the decoder's 400 for a wrong count."""
    if data.datatype != datatype or data.shape != shape:
        raise StaleScan(name)
    if isinstance(data.values, int):
        raise BadRequest(count_mismatch(name, shape, expected, data.values))
    return data.values.reshape(shape)


def count_mismatch(name: str, shape: tuple[int, ...], expected: int, got: int) -> str:
    """The decoder's message for data holding another number of values than its shape."""
    return f"input '{name}': shape {list(shape)} needs {expected} values, got {got}"
