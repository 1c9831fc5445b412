"""ONNX Runtime's view of a graph's tensors turned into V2 terms, without importing it.

ONNX Runtime describes each graph input and output by a type string (``tensor(float)``,
``seq(map(int64,tensor(float)))``) and a shape whose dimensions are numbers, symbolic
names or None. Here those become V2 datatypes and shapes (-1 for every dimension that is
not a fixed number), requests' arrays become what the graph takes (cast or refused with a
sentence), and the non-tensor outputs of converted classifiers (ZipMap's list of dicts,
one per row) become tensors. Pure functions, so the default environment tests them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from inferpool.errors import BadRequest
from inferpool.protocol.types import TensorSpec

# ONNX element types as ONNX Runtime names them: (numpy dtype, V2 datatype).
ELEMENT_TYPES: dict[str, tuple[Any, str]] = {
    "float": (np.float32, "FP32"),
    "double": (np.float64, "FP64"),
    "float16": (np.float16, "FP16"),
    "int8": (np.int8, "INT8"),
    "int16": (np.int16, "INT16"),
    "int32": (np.int32, "INT32"),
    "int64": (np.int64, "INT64"),
    "uint8": (np.uint8, "UINT8"),
    "uint16": (np.uint16, "UINT16"),
    "uint32": (np.uint32, "UINT32"),
    "uint64": (np.uint64, "UINT64"),
    "bool": (np.bool_, "BOOL"),
    "string": (np.object_, "BYTES"),
}
# The numpy kinds each target kind accepts without losing values: any number goes to a
# float graph (FP64 to FP32 rounds, as the converters' own float32 graphs assume), only
# integers to an integer graph, only booleans to a boolean one.
_CASTABLE = {"f": "biuf", "i": "biu", "u": "biu", "b": "b", "O": "OSU"}
# The element type inside a type string: the last tensor(...) of a sequence or map.
_TENSOR = re.compile(r"tensor\((\w+)\)")


@dataclass(frozen=True, slots=True)
class GraphTensor:
    """One input or output of the graph: its name, ONNX type string and V2 shape, and its
    element type as numpy and V2 know it (read once from the type: requests check them)."""

    name: str
    type: str
    shape: list[int]
    dtype: np.dtype[Any]
    datatype: str

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("tensor(")

    @property
    def is_zipmap(self) -> bool:
        """A sequence of maps, one per row: what skl2onnx's ZipMap makes of probabilities."""
        return self.type.startswith("seq(map(")

    def spec(self) -> TensorSpec:
        """Its V2 metadata: a sequence of maps is a [rows, classes] matrix."""
        return TensorSpec(self.name, self.datatype, self.shape if self.is_tensor else [-1, -1])

    def per_row(self) -> GraphTensor:
        """This tensor with its first dimension free (one per row of the input)."""
        if not self.is_tensor or not self.shape:
            return self
        return GraphTensor(self.name, self.type, [-1, *self.shape[1:]], self.dtype, self.datatype)


def element_type(type_name: str) -> str:
    """The element type (``float``, ``int64``...) of a type string: of the values of a
    sequence of maps, of a map's values, or of a tensor."""
    found = _TENSOR.findall(type_name)
    if found:
        return str(found[-1])
    inner = type_name.rstrip(")").rpartition(",")[2] or type_name
    return inner.rpartition("(")[2]


def graph_tensor(name: str, type_name: str, shape: Sequence[Any] | None) -> GraphTensor:
    """A GraphTensor from ONNX Runtime's NodeArg fields: a symbolic or unknown dimension
    (a name such as ``N``, or None) is -1."""
    dims = [d if isinstance(d, int) and d >= 0 else -1 for d in (shape or [])]
    element = element_type(type_name)
    numpy_type, datatype = ELEMENT_TYPES.get(element, (np.object_, "BYTES"))
    return GraphTensor(name, type_name, dims, np.dtype(numpy_type), datatype)


def check_array(model: str, tensor: GraphTensor, value: Any) -> np.ndarray:
    """``value`` as an array the graph input ``tensor`` accepts (no cast yet), or a 400
    naming the input and what it expects: its rank, fixed dimensions and element kind."""
    array = np.asarray(value)
    expected = tensor.shape
    if expected and (
        array.ndim != len(expected)
        or any(want not in (-1, got) for want, got in zip(expected, array.shape, strict=True))
    ):
        raise BadRequest(
            f"model '{model}' input '{tensor.name}' expects shape {expected}, "
            f"got {list(array.shape)}"
        )
    if array.ndim and array.shape[0] == 0:
        raise BadRequest(f"model '{model}' needs at least one row, got 0")
    kind = tensor.dtype.kind
    if array.dtype.kind not in _CASTABLE.get(kind, kind):
        raise BadRequest(
            f"model '{model}' input '{tensor.name}' takes {tensor.datatype} values, "
            f"got {array.dtype} data"
        )
    return array


def as_graph_input(tensor: GraphTensor, array: np.ndarray) -> np.ndarray:
    """``array`` (checked by ``check_array``) in the dtype the graph input wants: numbers
    cast (no copy when it is already that dtype), bytes decoded as UTF-8 for a string
    input (ONNX Runtime takes Python strings)."""
    if tensor.dtype.kind == "O":
        flat = [v.decode() if isinstance(v, bytes) else str(v) for v in array.ravel()]
        return np.array(flat, dtype=object).reshape(array.shape)
    return array.astype(tensor.dtype, copy=False)


def as_tensor(value: Any) -> Any:
    """An output as a tensor: an array as it is; ZipMap's list of dicts (one per row,
    class label to probability) as a [rows, classes] float32 matrix, columns in the
    dicts' key order (the converter's class order: the model's ``classes_``); any other
    sequence stacked row by row."""
    if isinstance(value, np.ndarray) or not isinstance(value, list | tuple):
        return value
    if value and isinstance(value[0], dict):
        keys = list(value[0])
        if len(keys) == 1:  # itemgetter of one key gives the value, not a tuple
            return np.array([[row[keys[0]]] for row in value], dtype=np.float32)
        # By key, not by each dict's own order: one C call per row (itemgetter).
        columns = itemgetter(*keys)
        return np.array([columns(row) for row in value], dtype=np.float32)
    return np.stack([np.asarray(row) for row in value]) if value else np.empty((0,))
