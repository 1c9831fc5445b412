"""GRPCInferenceService's SystemSharedMemoryStatus, SystemSharedMemoryRegister and
SystemSharedMemoryUnregister (Triton's system shared-memory extension,
``engine/shared_memory.py``), on both gRPC servers; the three CudaSharedMemory calls answer
UNIMPLEMENTED (CUDA shared memory is not served). An empty ``name`` means every region,
as in Triton's messages.
"""

from __future__ import annotations

from typing import Any

from inferpool.engine.client import EngineClient
from inferpool.engine.shared_memory import CudaUnsupported
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb


class SharedMemoryRpc:
    """The calls over the process's registry."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client

    async def status(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.client.shared_memory.status(request.name or None):
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    async def register(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.client.shared_memory.register(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.client.shared_memory.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def cuda(self, request: Any, context: Any) -> Any:
        raise CudaUnsupported()

    def methods(self) -> dict[str, tuple[Any, Any]]:
        """Name → (handler, request message), for ``typed_methods``."""
        return {
            "SystemSharedMemoryStatus": (self.status, pb.SystemSharedMemoryStatusRequest),
            "SystemSharedMemoryRegister": (self.register, pb.SystemSharedMemoryRegisterRequest),
            "SystemSharedMemoryUnregister": (
                self.unregister,
                pb.SystemSharedMemoryUnregisterRequest,
            ),
            "CudaSharedMemoryStatus": (self.cuda, pb.CudaSharedMemoryStatusRequest),
            "CudaSharedMemoryRegister": (self.cuda, pb.CudaSharedMemoryRegisterRequest),
            "CudaSharedMemoryUnregister": (self.cuda, pb.CudaSharedMemoryUnregisterRequest),
        }
