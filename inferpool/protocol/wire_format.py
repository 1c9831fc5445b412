"""What a wire format is: the pair of functions a worker runs on a request body of one
``Kind`` (``engine/ipc/messages.py``), and on the answer it sends back in the same format.

Each wire format is a module of ``protocol/`` (``rest_wire``, ``grpc_wire``,
``generate_wire``, ``rest_headers_wire``, ``grpc_headers_wire``) whose ``decode`` and
``encode`` make it a ``WireFormat``; ``engine/worker/wire_formats.py`` ties each ``Kind``
to one, and mypy checks every module it returns against this protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from inferpool.protocol.types import InferenceRequest, InferenceResponse

# A request body from the ring (and the length of its JSON part when binary tensors
# follow it, else None) → the request.
Decoder = Callable[[bytes, int | None], InferenceRequest]
# The response to a request → the answer's body (and the length of its JSON part when
# binary tensors follow it, else None).
Encoder = Callable[[InferenceResponse, InferenceRequest], tuple[bytes, int | None]]


@runtime_checkable
class WireFormat(Protocol):
    """A request body's format: ``decode`` it, ``encode`` the answer to it."""

    def decode(self, body: bytes, json_length: int | None, /) -> InferenceRequest: ...

    def encode(
        self, response: InferenceResponse, request: InferenceRequest, /
    ) -> tuple[bytes, int | None]: ...
