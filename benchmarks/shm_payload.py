"""The ``grpc-shm`` protocol: a local client's input through Triton's system shared memory.

The tensor is written once into a POSIX shared-memory object that the payload's region
names; the replayed gRPC message only names the region (its output still comes back in
the answer), so the request is a few dozen bytes whatever the batch. The region is
registered with each server before the scenario's check (``register``), and the objects
this process created are unlinked at its exit.
"""

from __future__ import annotations

import _posixshmem
import atexit
import contextlib
import mmap
import os
from dataclasses import dataclass

import numpy as np

PROTOCOL = "grpc-shm"
_CREATED: list[str] = []


@dataclass(frozen=True)
class SharedRegion:
    """A region as the server registers it: its name, the object's key and its size."""

    name: str
    key: str
    byte_size: int


def grpc_shm_request(model: str, x: np.ndarray, input_name: str) -> tuple[bytes, SharedRegion]:
    """A serialized ModelInferRequest whose FP32 input is in a new region holding ``x``."""
    from tritonclient.grpc import service_pb2

    raw = x.astype("<f4").tobytes()
    region = SharedRegion(
        f"bench-{model}-b{len(x)}", f"/inferpool-bench-{os.getpid()}-{model}-b{len(x)}", len(raw)
    )
    _write_object(region.key, raw)
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=input_name, datatype="FP32", shape=list(x.shape))
    tensor.parameters["shared_memory_region"].string_param = region.name
    tensor.parameters["shared_memory_byte_size"].int64_param = region.byte_size
    return request.SerializeToString(), region


def register(address: str, region: SharedRegion, timeout: float = 30.0) -> None:
    """Register ``region`` with the gRPC server at ``address`` (again, if it was)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.SystemSharedMemoryUnregisterRequest(name=region.name)
        stub.SystemSharedMemoryUnregister(request, timeout=timeout)
        stub.SystemSharedMemoryRegister(
            service_pb2.SystemSharedMemoryRegisterRequest(
                name=region.name, key=region.key, offset=0, byte_size=region.byte_size
            ),
            timeout=timeout,
        )


def _write_object(key: str, data: bytes) -> None:
    fd = _posixshmem.shm_open(key, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, len(data))
        with mmap.mmap(fd, len(data)) as view:
            view[:] = data
    finally:
        os.close(fd)
    if key not in _CREATED:
        _CREATED.append(key)


@atexit.register
def _unlink_created() -> None:
    for key in _CREATED:
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink(key)
