"""MLServer's ``inference.model_repository.ModelRepositoryService`` on both gRPC servers.

MLServer 1.x serves its repository calls twice: as GRPCInferenceService's
``RepositoryIndex``/``RepositoryModelLoad``/``RepositoryModelUnload`` and as this older
service, which ModelMesh's MLServer adapter and MLServer's own ``ModelRepositoryServiceStub``
still call. Its messages have the V2 ones' field numbers (``protocol/model_repository.proto``),
so both names are answered by the one implementation, ``InferenceService``'s handlers: the same
index entries, the same NOT_FOUND for a model the repository does not hold, the same admin
token and API keys (``api_keys.ADMIN_METHODS`` names the methods, whichever service).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferpool.protocol.generated import model_repository_pb2 as mr

if TYPE_CHECKING:
    from inferpool.frontends.grpc.service import InferenceService

REPOSITORY_SERVICE = "inference.model_repository.ModelRepositoryService"


def repository_methods(service: InferenceService) -> dict[str, tuple[Any, Any]]:
    """Method name → (handler(request, context), request message) for the service. The
    handlers answer with the V2 response messages, whose bytes are this service's."""
    return {
        "RepositoryIndex": (service.repository_index, mr.RepositoryIndexRequest),
        "RepositoryModelLoad": (service.repository_model_load, mr.RepositoryModelLoadRequest),
        "RepositoryModelUnload": (
            service.repository_model_unload,
            mr.RepositoryModelUnloadRequest,
        ),
    }
