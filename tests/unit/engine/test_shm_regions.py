"""A worker's mappings of shared-memory regions (engine/worker/shm_regions.py) and the
block that carries the table of regions to it (engine/ipc/shared_memory.py), on real
POSIX shared-memory objects."""

from __future__ import annotations

import _posixshmem
import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest

from inferpool.engine.ipc.shared_memory import Region, unwrap, wrap
from inferpool.engine.shared_memory import SharedMemoryRegistry
from inferpool.engine.worker import shm_regions
from inferpool.errors import BadRequest


@pytest.fixture
def key() -> Iterator[str]:
    key = f"/inferpool-unit-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = _posixshmem.shm_open(key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 8192)
    os.write(fd, bytes(range(256)) * 32)
    os.close(fd)
    yield key
    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink(key)


def test_the_table_travels_in_front_of_the_body():
    regions = {"r": Region("/k", 4096, 16, 7)}
    table, body = unwrap(wrap(1, regions, b"body"))
    assert (table.kind, table.regions, body) == (1, regions, b"body")
    with pytest.raises(BadRequest, match="truncated"):
        unwrap(b"\x00\x00\x01\x00abc")


def test_a_region_is_mapped_once_read_written_and_dropped(key):
    region = Region(key, 4100, 64, 1001)  # not on a page boundary
    assert shm_regions.read("r", region, 0, 4) == bytes([4, 5, 6, 7])  # byte 4100
    shm_regions.write("r", region, 8, b"\xff\xfe")
    assert shm_regions.read("r", region, 6, 6) == bytes([10, 11, 255, 254, 14, 15])
    assert shm_regions.mapped().count(1001) == 1
    shm_regions.drop([1001])
    assert 1001 not in shm_regions.mapped()
    # A request that was queued before the unregistration does not map it again.
    with pytest.raises(BadRequest, match="shared memory region 'r' was unregistered"):
        shm_regions.read("r", region, 0, 4)


def test_a_truncated_object_is_refused_before_any_access(key):
    region = Region(key, 0, 4096, 1002)
    shm_regions.read("r", region, 0, 8)
    os.truncate(f"/dev/shm{key}", 100)
    with pytest.raises(BadRequest, match=r"was truncated under the server: .* has 100 bytes"):
        shm_regions.read("r", region, 0, 4096)
    with pytest.raises(BadRequest, match="was truncated"):
        shm_regions.write("r", region, 96, b"12345678")
    assert shm_regions.read("r", region, 0, 8) == bytes(range(8))  # inside: still fine
    shm_regions.drop([1002])


def test_the_registry_checks_registrations_and_drops_on_unregister(key):
    dropped: list[list[int]] = []
    registry = SharedMemoryRegistry(dropped.append, limit=2)
    registry.register("a", key, 0, 8192)
    registry.register("b", key, 8000, 192)
    with pytest.raises(BadRequest, match="2 regions are registered already"):
        registry.register("c", key, 0, 8)
    with pytest.raises(BadRequest, match="byte_size must be positive"):
        registry.register("d", key, 0, 0)
    with pytest.raises(BadRequest, match="'offset' must be a non-negative integer"):
        registry.register("d", key, -1, 8)
    assert registry.tagged(0, b"no regions named")[1] == b"no regions named"
    kind, body = registry.tagged(0, b'{"shared_memory_region": "a"}')
    assert kind == 10 and unwrap(body)[0].regions == registry.regions
    registry.unregister("a")
    registry.unregister()
    assert len(dropped) == 2 and not registry.regions
