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
    """One input or output of the graph: its name, ONNX type string and V2 shape."""

    name: str
    type: str
    shape: list[int]

    @property
    def element(self) -> str:
        """The element type (``float``, ``int64``...): of the values of a sequence of maps."""
        found = _TENSOR.findall(self.type)
        if found:
            return str(found[-1])
        # A map's own values (``map(int64,float)``) or a bare element type.
        inner = self.type.rstrip(")").rpartition(",")[2] or self.type
        return inner.rpartition("(")[2]

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("tensor(")

    @property
    def is_zipmap(self) -> bool:
        """A sequence of maps, one per row: what skl2onnx's ZipMap makes of probabilities."""
        return self.type.startswith("seq(map(")

    def spec(self) -> TensorSpec:
        """Its V2 metadata: a sequence of maps is a [rows, classes] matrix."""
        _, datatype = ELEMENT_TYPES.get(self.element, (None, "BYTES"))
        shape = self.shape if self.is_tensor else [-1, -1]
        return TensorSpec(self.name, datatype, shape)

    def per_row(self) -> GraphTensor:
        """This tensor with its first dimension free (one per row of the input)."""
        if not self.is_tensor or not self.shape:
            return self
        return GraphTensor(self.name, self.type, [-1, *self.shape[1:]])

    def numpy_dtype(self) -> Any:
        return ELEMENT_TYPES.get(self.element, (np.object_, ""))[0]


def graph_tensor(name: str, type_name: str, shape: Sequence[Any] | None) -> GraphTensor:
    """A GraphTensor from ONNX Runtime's NodeArg fields: a symbolic or unknown dimension
    (a name such as ``N``, or None) is -1."""
    dims = [d if isinstance(d, int) and d >= 0 else -1 for d in (shape or [])]
    return GraphTensor(name, type_name, dims)


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
    kind = np.dtype(tensor.numpy_dtype()).kind
    if array.dtype.kind not in _CASTABLE.get(kind, kind):
        _, datatype = ELEMENT_TYPES.get(tensor.element, (None, tensor.element))
        raise BadRequest(
            f"model '{model}' input '{tensor.name}' takes {datatype} values, got {array.dtype} data"
        )
    return array


def as_graph_input(tensor: GraphTensor, array: np.ndarray) -> np.ndarray:
    """``array`` (checked by ``check_array``) in the dtype the graph input wants: numbers
    cast (no copy when it is already that dtype), bytes decoded as UTF-8 for a string
    input (ONNX Runtime takes Python strings)."""
    dtype = tensor.numpy_dtype()
    if dtype is np.object_:
        flat = [v.decode() if isinstance(v, bytes) else str(v) for v in array.ravel()]
        return np.array(flat, dtype=object).reshape(array.shape)
    return array.astype(dtype, copy=False)


def as_tensor(value: Any) -> Any:
    """An output as a tensor: an array as it is; ZipMap's list of dicts (one per row,
    class label to probability) as a [rows, classes] float32 matrix, columns in the
    dicts' key order (the converter's class order: the model's ``classes_``); any other
    sequence stacked row by row."""
    if isinstance(value, np.ndarray) or not isinstance(value, list | tuple):
        return value
    if value and isinstance(value[0], dict):
        keys = list(value[0])
        return np.array([[row[k] for k in keys] for row in value], dtype=np.float32)
    return np.stack([np.asarray(row) for row in value]) if value else np.empty((0,))
