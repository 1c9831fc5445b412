"""V2 datatype names and their numpy equivalents, and the checks that a value fits a datatype."""

from __future__ import annotations

import sys

import numpy as np

from inferpool.errors import BadRequest, TooLarge
from inferpool.protocol.limits import DecodeLimits

NUMPY_BY_DATATYPE: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
DATATYPES = tuple(NUMPY_BY_DATATYPE)
_DATATYPE_BY_NUMPY = {dt: name for name, dt in NUMPY_BY_DATATYPE.items() if name != "BYTES"}


def numpy_dtype(datatype: str, input_name: str = "") -> np.dtype:
    """The numpy dtype for a V2 datatype name; a 400 for an unknown name."""
    try:
        return NUMPY_BY_DATATYPE[datatype]
    except (KeyError, TypeError):
        where = f"input '{input_name}': " if input_name else ""
        raise BadRequest(
            f"{where}unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        ) from None


def datatype_of(array: np.ndarray) -> str:
    """The V2 datatype that carries a numpy array without loss."""
    dtype = array.dtype
    if dtype.kind in "OUSV":
        return "BYTES"
    name = _DATATYPE_BY_NUMPY.get(dtype.newbyteorder("=") if dtype.byteorder == ">" else dtype)
    if name is None:
        raise TypeError(f"no V2 datatype carries numpy dtype {dtype}")
    return name


def element_count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


#: most dimensions a tensor may declare (numpy's own limit is 64)
MAX_DIMS = 32
# What one decoded BYTES element costs at least: its pointer and an empty bytes object.
_BYTES_ELEMENT = 8 + sys.getsizeof(b"")


def check_shape(shape: object, input_name: str) -> tuple[int, ...]:
    """A declared shape as a tuple of non-negative ints, or a 400 naming the input."""
    if not isinstance(shape, list | tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise BadRequest(f"input '{input_name}': shape must be a list of non-negative integers")
    if len(shape) > MAX_DIMS:
        raise BadRequest(
            f"input '{input_name}': shape has {len(shape)} dimensions, more than {MAX_DIMS}"
        )
    return tuple(shape)


def admit(
    name: str, datatype: str, shape: tuple[int, ...], spent: int, limits: DecodeLimits
) -> tuple[int, int]:
    """Check a tensor's declared size against the limits before anything is allocated.

    Returns its element count and the bytes the request's tensors decode to so far
    (``spent`` plus this tensor's). Elements over ``max_tensor_elements`` (or one
    dimension alone over it, which numpy could not even reshape to) are a 400; bytes over
    ``max_request_tensor_bytes`` summed over the request are a 413. A BYTES element counts
    as its pointer in the object array plus an empty ``bytes`` object: its content is
    bounded by the body itself, but millions of tiny elements cost far more than their bytes.
    """
    count = 1
    for dim in shape:
        count *= dim
    most = limits.max_tensor_elements
    if count > most or (count == 0 and any(dim > most for dim in shape)):
        raise BadRequest(
            f"input '{name}': shape {list(shape)} declares {count} elements, over the limit "
            f"of {most} (max_tensor_elements)"
        )
    spent += count * (
        _BYTES_ELEMENT if datatype == "BYTES" else NUMPY_BY_DATATYPE[datatype].itemsize
    )
    if spent > limits.max_request_tensor_bytes:
        raise TooLarge(
            f"input '{name}': the request's tensors would take {spent} bytes, over the limit "
            f"of {limits.max_request_tensor_bytes} (max_request_tensor_bytes)"
        )
    return count, spent


def cast_checked(values: np.ndarray, datatype: str, input_name: str) -> np.ndarray:
    """Cast parsed values to the datatype's dtype, refusing any value that does not fit.

    Vectorised: one pass of min/max or isfinite, never a Python loop per element.
    """
    target = NUMPY_BY_DATATYPE[datatype]
    kind = values.dtype.kind
    if values.size == 0:
        return values.astype(target)
    if target.kind == "b":
        if kind != "b":
            raise BadRequest(f"input '{input_name}': BOOL data must be true or false")
        return values
    if kind not in "biuf":
        raise BadRequest(f"input '{input_name}': {datatype} data must be numbers")
    if target.kind in "iu":
        if kind in "fb":
            raise BadRequest(f"input '{input_name}': {datatype} data must be integers")
        info = np.iinfo(target)
        if values.min() < info.min or values.max() > info.max:
            raise BadRequest(
                f"input '{input_name}': a value is out of range for {datatype} "
                f"[{info.min}, {info.max}]"
            )
        return values.astype(target, copy=False)
    if kind == "b":
        raise BadRequest(f"input '{input_name}': {datatype} data must be numbers")
    with np.errstate(over="ignore"):  # overflow is detected below, as a 400
        cast = values.astype(target, copy=False)
    if (
        target != values.dtype
        and kind == "f"
        and not np.array_equal(np.isfinite(cast), np.isfinite(values))
    ):
        raise BadRequest(f"input '{input_name}': a value is out of range for {datatype}")
    return cast
