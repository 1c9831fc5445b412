"""A worker's mappings of the system shared-memory regions its requests name
(``engine/ipc/shared_memory.py``): each registration is mapped once per process, on first
use, and cached under its serial until the frontend says it was unregistered
(``DropRegions``). Inputs are copied out of the mapping and outputs into it here, after the
bounds are checked, so that nothing else in the worker ever touches a mapping.

A region's object may change under the server: unlinked (the mapping and its descriptor
keep the memory alive: reads and writes stay valid, only the client no longer sees them),
or truncated (touching a mapped page past the object's new end raises SIGBUS, which would
kill the worker): the object's size is checked with ``fstat`` right before each access.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

from inferpool.engine.ipc.shared_memory import Region, open_object
from inferpool.errors import BadRequest

_GRANULARITY = mmap.ALLOCATIONGRANULARITY


@dataclass(slots=True)
class _Mapping:
    fd: int  # kept open: fstat before each access
    view: mmap.mmap  # from the page that holds the region's first byte
    base: int  # the region's first byte in ``view``
    start: int  # ``view``'s first byte in the object


_MAPPINGS: dict[int, _Mapping] = {}  # by registration serial
# Serials unregistered: a request queued before its region was unregistered must not map
# it again (that mapping would never be dropped).
_DROPPED: set[int] = set()


def read(name: str, region: Region, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` into the region (the caller checked they are inside)."""
    mapping = _mapping(name, region)
    first = mapping.base + offset
    _check_size(mapping, name, region, first + size)
    return mapping.view[first : first + size]  # one copy, out of the client's memory


def write(name: str, region: Region, offset: int, data: bytes | memoryview) -> None:
    """``data`` at ``offset`` into the region (the caller checked it fits)."""
    mapping = _mapping(name, region)
    first = mapping.base + offset
    _check_size(mapping, name, region, first + len(data))
    mapping.view[first : first + len(data)] = data


def drop(serials: list[int]) -> None:
    """Unmap these registrations (unregistered): their memory goes once the client's
    last reference does."""
    _DROPPED.update(serials)
    for serial in serials:
        mapping = _MAPPINGS.pop(serial, None)
        if mapping is not None:
            mapping.view.close()
            os.close(mapping.fd)


def mapped() -> list[int]:
    """The serials mapped in this process (for tests and the debug log)."""
    return list(_MAPPINGS)


def _mapping(name: str, region: Region) -> _Mapping:
    mapping = _MAPPINGS.get(region.serial)
    if mapping is None:
        if region.serial in _DROPPED:
            raise BadRequest(f"shared memory region '{name}' was unregistered")
        mapping = _MAPPINGS[region.serial] = _map(name, region)
    return mapping


def _map(name: str, region: Region) -> _Mapping:
    fd = open_object(region.key)
    try:
        end = region.offset + region.byte_size
        size = os.fstat(fd).st_size
        if size < end:
            raise BadRequest(
                f"shared memory region '{name}' ends at byte {end}, but its object "
                f"'{region.key}' has {size} bytes now"
            )
        start = region.offset - region.offset % _GRANULARITY
        view = mmap.mmap(fd, end - start, offset=start)
    except BaseException:
        os.close(fd)
        raise
    return _Mapping(fd, view, region.offset - start, start)


def _check_size(mapping: _Mapping, name: str, region: Region, end_in_view: int) -> None:
    """Refuse an access past the object's current end (SIGBUS otherwise).

    The race that remains: a client that truncates the object between this fstat and
    the copy still gets the worker killed by SIGBUS (the pool then fails that worker's
    requests with 503 and starts another). Closing it would take a SIGBUS handler around
    each copy, which Python cannot install for one thread; a client that shrinks memory
    it registered with the server is harming only its own requests.
    """
    size = os.fstat(mapping.fd).st_size
    needed = mapping.start + end_in_view
    if size < needed:
        raise BadRequest(
            f"shared memory region '{name}' was truncated under the server: its object "
            f"'{region.key}' has {size} bytes, the access needs {needed}"
        )
