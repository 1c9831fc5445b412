"""inferpool: a high-throughput Open Inference Protocol (KServe V2) server and engine.

Public API: ``Engine`` (embedded serving), ``Runtime`` (custom models), the V2 structs.
"""

from inferpool.engine.embedded import Engine
from inferpool.protocol.types import InferenceRequest, InferenceResponse, Tensor, TensorSpec
from inferpool.runtimes.base import Runtime

__version__ = "0.1.0"

__all__ = [
    "Engine",
    "InferenceRequest",
    "InferenceResponse",
    "Runtime",
    "Tensor",
    "TensorSpec",
    "__version__",
]
