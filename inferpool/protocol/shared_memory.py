"""Triton's system shared-memory extension, as far as the wire formats see it: the tensor
parameters that name a registered region (``shared_memory_region``,
``shared_memory_byte_size``, optional ``shared_memory_offset``), checked, and the
placeholder an input gets until a worker fills it from the region.

Only a request the frontend wrapped with its table of regions (``Kind.REST_SHM`` /
``Kind.GRPC_SHM``, engine/worker/shm_wire.py) may carry such an input: that decoder sets
``resolving``; a plain decoder meeting one refuses it (no region is registered), so an
input never reaches a model with its placeholder instead of its data.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from inferpool.errors import BadRequest
from inferpool.protocol.types import Tensor

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"

_RESOLVING: contextvars.ContextVar[bool] = contextvars.ContextVar("shm_resolving", default=False)


class TensorRegion(NamedTuple):
    """Where a tensor's bytes are: a registered region's name, and a part of it."""

    region: str
    byte_size: int
    offset: int


@contextmanager
def resolving() -> Iterator[None]:
    """Inputs naming a region become placeholders (the caller fills them) while inside."""
    token = _RESOLVING.set(True)
    try:
        yield
    finally:
        _RESOLVING.reset(token)


def placeholder(
    name: str, datatype: str, shape: tuple[int, ...], parameters: dict[str, Any]
) -> Tensor:
    """The input ``name`` whose data is in a region: no data yet (its parameters are
    checked now, so that a bad one is a 400 before anything is mapped)."""
    where = tensor_region(parameters, name, "input")
    if not _RESOLVING.get():
        # The frontend sends the table of regions along only while some are registered
        # (and only with a body that names one plainly, not through JSON escapes).
        raise BadRequest(
            f"input '{name}' names shared memory region '{where.region}', which is not registered"
        )
    return Tensor(name, datatype, shape, np.empty(0), parameters)


def tensor_region(parameters: dict[str, Any], name: str, what: str) -> TensorRegion:
    """The region parameters of a tensor (or requested output), checked: a 400 naming it."""
    region = parameters.get(REGION)
    if not isinstance(region, str) or not region:
        raise BadRequest(f"{what} '{name}': {REGION} must be a region's name")
    byte_size = _count(parameters.get(BYTE_SIZE), BYTE_SIZE, name, what)
    if byte_size is None:
        raise BadRequest(f"{what} '{name}' names region '{region}' but has no {BYTE_SIZE}")
    offset = _count(parameters.get(OFFSET), OFFSET, name, what) or 0
    return TensorRegion(region, byte_size, offset)


def _count(value: object, key: str, name: str, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{what} '{name}': {key} must be a non-negative integer, got {value!r}")
    return value
