"""inferpool: a high-throughput Open Inference Protocol (KServe V2) server and engine.

Public API: ``Engine`` (embedded serving) and ``InferenceResult`` (what its ``infer``
returns), ``Runtime`` (custom models), the typed V2 structs (``InferenceRequest``,
``RequestedOutput``, ``InferenceResponse``, ``Tensor``, ``TensorSpec``). Errors are in
``inferpool.errors``.
"""

from inferpool.engine.embedded import Engine
from inferpool.engine.embedded_io import InferenceResult
from inferpool.protocol.types import (
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
    TensorSpec,
)
from inferpool.runtimes.base import Runtime

__version__ = "0.1.0"

__all__ = [
    "Engine",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResult",
    "RequestedOutput",
    "Runtime",
    "Tensor",
    "TensorSpec",
    "__version__",
]
