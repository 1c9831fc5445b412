"""Triton's binary tensor data extension on REST: raw tensor bytes after the JSON header."""

from __future__ import annotations

from typing import Any

import numpy as np

from inferpool.errors import BadRequest
from inferpool.protocol.datatypes import NUMPY_BY_DATATYPE, element_count
from inferpool.protocol.types import Tensor


def attach_binary_inputs(
    inputs: list[Tensor], raw_inputs: list[dict[str, Any]], tail: memoryview
) -> None:
    """Fill each input that has ``binary_data_size`` from the bytes after the JSON header.

    Inputs take their bytes in order; numeric tensors are zero-copy views of the body.
    """
    offset = 0
    for tensor in inputs:
        size = tensor.parameters.get("binary_data_size")
        if size is None:
            continue
        if not isinstance(size, int) or size < 0 or offset + size > len(tail):
            raise BadRequest(f"input '{tensor.name}': binary_data_size {size!r} runs past the body")
        chunk = tail[offset : offset + size]
        offset += size
        tensor.data = tensor_from_bytes(chunk, tensor.datatype, tensor.shape, tensor.name)
    if offset != len(tail):
        raise BadRequest(f"{len(tail) - offset} bytes after the last binary input")


def tensor_from_bytes(chunk: memoryview, datatype: str, shape: tuple[int, ...], name: str):
    """Little-endian row-major bytes (BYTES: 4-byte length-prefixed elements) as an ndarray."""
    count = element_count(shape)
    if datatype == "BYTES":
        return _bytes_elements(chunk, count, name).reshape(shape)
    dtype = NUMPY_BY_DATATYPE[datatype].newbyteorder("<")
    if len(chunk) != count * dtype.itemsize:
        raise BadRequest(
            f"input '{name}': shape {list(shape)} of {datatype} needs "
            f"{count * dtype.itemsize} bytes, got {len(chunk)}"
        )
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


def _bytes_elements(chunk: memoryview, count: int, name: str) -> np.ndarray:
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > len(chunk):
            raise BadRequest(f"input '{name}': BYTES data ends inside element {i}")
        length = int.from_bytes(chunk[offset : offset + 4], "little")
        offset += 4
        if offset + length > len(chunk):
            raise BadRequest(f"input '{name}': BYTES element {i} runs past the data")
        out[i] = bytes(chunk[offset : offset + length])
        offset += length
    if offset != len(chunk):
        raise BadRequest(f"input '{name}': {len(chunk) - offset} bytes after the last element")
    return out


def bytes_elements_to_wire(data: np.ndarray) -> bytes:
    """BYTES elements as 4-byte little-endian length-prefixed bytes, row-major."""
    parts = []
    for item in data.reshape(-1):
        raw = item if isinstance(item, bytes) else str(item).encode()
        parts.append(len(raw).to_bytes(4, "little"))
        parts.append(raw)
    return b"".join(parts)
