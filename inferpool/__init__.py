"""inferpool: a high-throughput Open Inference Protocol (KServe V2) server and engine.

Public API: ``Engine`` (embedded serving) and ``InferenceResult`` (what its ``infer``
returns), ``Runtime`` (custom models) and ``custom_endpoint`` (its own routes, with
``EndpointRequest`` / ``EndpointResponse``), the typed V2 structs (``InferenceRequest``,
``RequestedOutput``, ``InferenceResponse``, ``Tensor``, ``TensorSpec``). Errors are in
``inferpool.errors``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from inferpool.runtimes.endpoints import EndpointRequest, EndpointResponse, custom_endpoint

# Imported on first use: every process that imports any inferpool module runs this file,
# and the server's frontend must not load the codecs and the inference path with it; nor
# numpy and pydantic before the command line can catch a Ctrl-C (inferpool.cli).
_LAZY = {
    "Engine": "inferpool.engine.embedded",
    "InferenceResult": "inferpool.engine.embedded_io",
    "InferenceRequest": "inferpool.protocol.types",
    "InferenceResponse": "inferpool.protocol.types",
    "RequestedOutput": "inferpool.protocol.types",
    "Tensor": "inferpool.protocol.types",
    "TensorSpec": "inferpool.protocol.types",
    "Runtime": "inferpool.runtimes.base",
    "EndpointRequest": "inferpool.runtimes.endpoints",
    "EndpointResponse": "inferpool.runtimes.endpoints",
    "custom_endpoint": "inferpool.runtimes.endpoints",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'inferpool' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "EndpointRequest",
    "EndpointResponse",
    "Engine",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResult",
    "RequestedOutput",
    "Runtime",
    "Tensor",
    "TensorSpec",
    "__version__",
    "custom_endpoint",
]
