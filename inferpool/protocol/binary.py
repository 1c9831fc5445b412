"""Triton's binary tensor data extension on REST: raw tensor bytes after the JSON header.

Requests: inputs with ``parameters.binary_data_size`` take their bytes, in order, from
the body after its first ``Inference-Header-Content-Length`` bytes. Responses: outputs the
request asks for in binary (``parameters.binary_data_output`` on the request, or
``parameters.binary_data`` on a requested output) go after the JSON the same way.
Numeric tensors are little-endian row-major; BYTES elements are 4-byte little-endian
length-prefixed.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from inferpool.errors import BadRequest
from inferpool.protocol.datatypes import NUMPY_BY_DATATYPE, element_count
from inferpool.protocol.shared_memory import REGION
from inferpool.protocol.types import InferenceRequest, Tensor

_LENGTH = struct.Struct("<I")


def attach_binary_tensors(tensors: list[Tensor], tail: memoryview, what: str = "input") -> None:
    """Fill each tensor that has ``binary_data_size`` from the bytes after the JSON header.

    Tensors take their bytes in order; numeric tensors are zero-copy views of the body.
    """
    offset = 0
    for tensor in tensors:
        size = tensor.parameters.get("binary_data_size")
        if size is None:
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadRequest(
                f"{what} '{tensor.name}': binary_data_size must be a non-negative integer"
            )
        if offset + size > len(tail):
            raise BadRequest(
                f"{what} '{tensor.name}': binary_data_size {size} runs past the body "
                f"({len(tail) - offset} bytes left)"
            )
        chunk = tail[offset : offset + size]
        offset += size
        tensor.data = tensor_from_bytes(chunk, tensor.datatype, tensor.shape, tensor.name)
    if offset != len(tail):
        raise BadRequest(f"{len(tail) - offset} bytes after the last binary {what}")


def tensor_from_bytes(
    chunk: bytes | memoryview, datatype: str, shape: tuple[int, ...], name: str
) -> np.ndarray:
    """Little-endian row-major bytes (BYTES: 4-byte length-prefixed elements) as an ndarray."""
    count = element_count(shape)
    if datatype == "BYTES":
        if count * 4 > len(chunk):
            # Each element carries at least its 4-byte length: a larger count is a lie,
            # refused before its object array is allocated.
            raise BadRequest(
                f"input '{name}': shape {list(shape)} declares {count} BYTES elements, but "
                f"{len(chunk)} bytes hold at most {len(chunk) // 4}"
            )
        return _bytes_elements(memoryview(chunk), count, name).reshape(shape)
    dtype = NUMPY_BY_DATATYPE[datatype].newbyteorder("<")
    if len(chunk) != count * dtype.itemsize:
        raise BadRequest(
            f"input '{name}': shape {list(shape)} of {datatype} needs "
            f"{count * dtype.itemsize} bytes, got {len(chunk)}"
        )
    array = np.frombuffer(chunk, dtype=dtype)
    if not array.flags.aligned:
        # A view at an odd offset would slow every later operation: copy it once.
        array = array.copy()
    return array.reshape(shape)


def _bytes_elements(chunk: memoryview, count: int, name: str) -> np.ndarray:
    out = np.empty(count, dtype=object)
    raw = bytes(chunk)
    offset = 0
    end = len(raw)
    for i in range(count):
        if offset + 4 > end:
            raise BadRequest(f"input '{name}': BYTES data ends inside element {i}")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > end:
            raise BadRequest(f"input '{name}': BYTES element {i} runs past the data")
        out[i] = raw[offset : offset + length]
        offset += length
    if offset != end:
        raise BadRequest(f"input '{name}': {end - offset} bytes after the last element")
    return out


def tensor_to_bytes(tensor: Tensor) -> bytes | memoryview:
    """A tensor's data as the extension carries it (the inverse of ``tensor_from_bytes``);
    numeric data is a view of the array when it is already contiguous little-endian."""
    if tensor.datatype == "BYTES":
        return bytes_elements_to_wire(tensor.data)
    dtype = NUMPY_BY_DATATYPE[tensor.datatype].newbyteorder("<")
    array = np.ascontiguousarray(tensor.data, dtype=dtype).reshape(-1)
    return memoryview(array.data).cast("B") if array.size else b""


def bytes_elements_to_wire(data: np.ndarray) -> bytes:
    """BYTES elements as 4-byte little-endian length-prefixed bytes, row-major."""
    pack = _LENGTH.pack
    parts = []
    for item in data.reshape(-1).tolist():
        raw = item if isinstance(item, bytes) else str(item).encode()
        parts.append(pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def binary_outputs(request: InferenceRequest, outputs: list[Tensor]) -> list[bool]:
    """Which outputs the request asks for in binary: a requested output's own
    ``binary_data`` wins over the request's ``binary_data_output``."""
    default = _flag(request.parameters.get("binary_data_output"), "binary_data_output")
    own = {
        requested.name: _flag(requested.parameters["binary_data"], "binary_data")
        for requested in request.outputs
        if "binary_data" in requested.parameters
    }
    # An output written into a shared-memory region carries no data at all.
    return [own.get(output.name, default) and REGION not in output.parameters for output in outputs]


def _flag(value: Any, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"parameter '{name}' must be true or false, got {value!r}")
    return value


def split_binary_outputs(
    outputs: list[Tensor], binary: list[bool]
) -> tuple[list[Tensor], list[bytes | memoryview]]:
    """Outputs for the JSON header (binary ones carrying ``binary_data_size`` and no data),
    and the buffers that follow the header, in order (joined once, by the caller)."""
    parts: list[bytes | memoryview] = []
    header: list[Tensor] = []
    for output, as_binary in zip(outputs, binary, strict=True):
        if not as_binary:
            header.append(output)
            continue
        raw = tensor_to_bytes(output)
        parts.append(raw)
        parameters = {**output.parameters, "binary_data_size": len(raw)}
        # Its data travels in the binary tail; the JSON header carries none.
        header.append(Tensor(output.name, output.datatype, output.shape, np.empty(0), parameters))
    return header, parts
