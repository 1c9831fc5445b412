"""The table of wire formats: how a worker decodes a request body of each ``Kind`` and
encodes the response in the same format.

The protocol layer only provides the functions (``protocol/rest_wire.py``,
``protocol/grpc_wire.py``) and imports nothing of the engine; this table is the one place
that ties a ``Kind`` to them. A format's module is imported on first use, so a process
only loads what it serves (gRPC's protobuf code stays out of a REST-only process).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from inferpool.engine.ipc.messages import Kind
from inferpool.protocol.types import InferenceRequest, InferenceResponse

Decoder = Callable[[bytes, int | None], InferenceRequest]
Encoder = Callable[[InferenceResponse, InferenceRequest], tuple[bytes, int | None]]

# Kind → the protocol module with ``decode(body, json_length)`` and ``encode(response, request)``.
MODULES: dict[int, str] = {
    Kind.REST: "inferpool.protocol.rest_wire",
    Kind.GRPC: "inferpool.protocol.grpc_wire",
    Kind.REST_HEADERS: "inferpool.codecs.rest_headers_wire",
    Kind.GRPC_HEADERS: "inferpool.codecs.grpc_headers_wire",
    Kind.REST_STREAM: "inferpool.protocol.rest_wire",
    Kind.GRPC_STREAM: "inferpool.protocol.grpc_wire",
    Kind.GENERATE: "inferpool.protocol.generate_wire",
    Kind.GENERATE_STREAM: "inferpool.protocol.generate_wire",
    Kind.GRPC_STREAM_IN: "inferpool.protocol.grpc_wire",
}
_LOADED: dict[int, tuple[Decoder, Encoder]] = {}


def wire_format(kind: int) -> tuple[Decoder, Encoder]:
    """The decoder and encoder of ``kind``; KeyError for a kind with no wire format."""
    entry = _LOADED.get(kind)
    if entry is None:
        module = importlib.import_module(MODULES[kind])
        entry = _LOADED[kind] = (module.decode, module.encode)
    return entry
