"""How a request that uses Triton's system shared memory reaches a worker: the frontend
puts the table of registered regions in front of the body (``wrap``, as
``Kind.REST_SHM`` / ``Kind.GRPC_SHM``), and the worker maps the regions itself
(``engine/worker/shm_regions.py``): tensor bytes never pass through the frontend.

Each registration has a serial, unique in the server's life: a worker caches its mapping
under it, so a region registered again under the same name (another key, another offset)
is never read through a stale mapping, even before ``DropRegions`` (sent on unregister,
on the control channel) arrives. Nothing here imports the rest of the engine.
"""

from __future__ import annotations

import _posixshmem  # CPython's shm_open, as multiprocessing.shared_memory uses it
import os

import msgspec

from inferpool.engine.ipc.ops import Control, Op
from inferpool.errors import BadRequest

# The block's length in front of it: 4 bytes, big-endian.
_LENGTH = 4


class Region(msgspec.Struct, frozen=True, array_like=True):
    """A registered region: the POSIX shared-memory object ``key`` (shm_open's name),
    the part of it registered, and the registration's serial."""

    key: str
    offset: int
    byte_size: int
    serial: int


class RegionTable(msgspec.Struct, frozen=True, array_like=True):
    """What travels in front of the body: the body's own kind, and the regions by name."""

    kind: int
    regions: dict[str, Region]


class DropRegions(Control, frozen=True):
    """frontend → worker: unmap these registrations (by serial); they were unregistered."""

    op = Op.SHM_DROP
    serials: list[int]


def open_object(key: str) -> int:
    """A descriptor of the shared-memory object ``key`` (read-write); a 400 naming it."""
    try:
        return int(_posixshmem.shm_open(key, os.O_RDWR, 0))
    except FileNotFoundError:
        raise BadRequest(f"shared memory object '{key}' does not exist") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        reason = getattr(exc, "strerror", None) or str(exc)
        raise BadRequest(f"cannot open shared memory object '{key}': {reason}") from None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(RegionTable)


def wrap(kind: int, regions: dict[str, Region], body: bytes) -> bytes:
    """The table block, then the body (of ``kind``)."""
    block = _ENCODER.encode(RegionTable(kind, regions))
    return len(block).to_bytes(_LENGTH, "big") + block + body


def unwrap(body: bytes) -> tuple[RegionTable, bytes]:
    """The table and the body that ``wrap`` joined (the body is the JSON or protobuf
    message alone: its tensors are in the regions, so copying it out is cheap)."""
    size = int.from_bytes(body[:_LENGTH], "big")
    end = _LENGTH + size
    if len(body) < end:
        raise BadRequest("shared memory block is truncated")  # only a bug sends this
    try:
        table = _DECODER.decode(body[_LENGTH:end])
    except msgspec.DecodeError:
        raise BadRequest("shared memory block is malformed") from None
    return table, body[end:]
