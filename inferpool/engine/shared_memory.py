"""The server's table of registered system shared-memory regions (Triton's
``systemsharedmemory`` extension), shared by the REST and gRPC frontends of the process.

Registering opens the client's POSIX shared-memory object once, to check that it exists
and holds the part registered, and closes it: only the workers map regions
(``engine/worker/shm_regions.py``). A request that names a region travels with the
table in front of its body (``tagged``); unregistering tells every worker to unmap
(``EngineClient.drop_shared_memory``). CUDA shared memory is not served
(``CudaUnsupported``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

from inferpool.engine.ipc.messages import Kind
from inferpool.engine.ipc.shared_memory import Region, open_object, wrap
from inferpool.errors import BadRequest

# What a body must contain to name a region (JSON key, or protobuf map key): bodies
# without it are never wrapped, so requests that use no region pay one memmem at most.
MARKER = b"shared_memory_region"
_WRAPPED = {Kind.REST: Kind.REST_SHM, Kind.REST_HEADERS: Kind.REST_SHM,
            Kind.GRPC: Kind.GRPC_SHM, Kind.GRPC_HEADERS: Kind.GRPC_SHM}  # fmt: skip


class CudaUnsupported(BadRequest):
    """A CUDA shared-memory call: 400 over REST, UNIMPLEMENTED over gRPC."""

    def __init__(self) -> None:
        super().__init__(
            "CUDA shared memory is not supported: this server serves only system shared "
            "memory (/v2/systemsharedmemory)"
        )

    @property
    def grpc_code(self) -> str:
        return "UNIMPLEMENTED"


class SharedMemoryRegistry:
    """The registered regions by name; ``drop`` unmaps serials in every worker."""

    def __init__(self, drop: Callable[[list[int]], None], limit: int) -> None:
        self.regions: dict[str, Region] = {}
        self._drop = drop
        self._limit = limit
        self._serials = itertools.count(1)

    def register(self, name: Any, key: Any, offset: Any, byte_size: Any) -> None:
        """Register ``name``: a 400 naming the problem, before anything is kept."""
        if not isinstance(name, str) or not name:
            raise BadRequest("a shared memory region needs a non-empty name")
        if not isinstance(key, str) or not key:
            raise BadRequest(f"shared memory region '{name}': 'key' must be a non-empty string")
        offset = _count(offset, "offset", name)
        byte_size = _count(byte_size, "byte_size", name)
        if byte_size == 0:
            raise BadRequest(f"shared memory region '{name}': byte_size must be positive")
        if name in self.regions:
            raise BadRequest(
                f"shared memory region '{name}' is already registered; unregister it first"
            )
        if len(self.regions) >= self._limit:
            raise BadRequest(
                f"cannot register shared memory region '{name}': {self._limit} regions are "
                "registered already (--max-shared-memory-regions)"
            )
        fd = open_object(key)
        try:
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if offset + byte_size > size:
            raise BadRequest(
                f"shared memory region '{name}': offset {offset} + byte_size {byte_size} runs "
                f"past the end of object '{key}' ({size} bytes)"
            )
        self.regions[name] = Region(key, offset, byte_size, next(self._serials))

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """Triton's status document: every region, or the one named (a 400 if unknown)."""
        if name is None:
            chosen = self.regions
        elif name in self.regions:
            chosen = {name: self.regions[name]}
        else:
            raise BadRequest(f"shared memory region '{name}' is not registered")
        return [
            {"name": n, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for n, r in chosen.items()
        ]

    def unregister(self, name: str | None = None) -> None:
        """Forget ``name`` (or every region) and unmap it everywhere; an unknown name is
        no error, as Triton has it."""
        names = list(self.regions) if name is None else [name]
        dropped = [self.regions.pop(n).serial for n in names if n in self.regions]
        if dropped:
            self._drop(dropped)

    def tagged(self, kind: int, body: bytes) -> tuple[int, bytes]:
        """The kind and body a request travels as: with the table of regions in front
        when it names one (only when some are registered: else its decoder refuses it)."""
        if self.regions and MARKER in body:
            return _WRAPPED[Kind(kind)], wrap(kind, self.regions, body)
        return kind, body


def _count(value: Any, what: str, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(
            f"shared memory region '{name}': '{what}' must be a non-negative integer, got {value!r}"
        )
    return value
