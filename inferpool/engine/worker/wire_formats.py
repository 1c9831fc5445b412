"""The table of wire formats: which ``protocol/`` module decodes a request body of each
``Kind`` and encodes the response in the same format (a ``WireFormat``).

The protocol layer only provides the modules and imports nothing of the engine; this
table is the one place that ties a ``Kind`` to them, and mypy checks each loader's module
against ``WireFormat``. A loader imports its module on first use, so a process only loads
what it serves: gRPC's protobuf code stays out of a REST-only process and out of a
frontend that runs pipelines over REST (``engine/pipelines/manager.py``), and the headers
block's code out of a worker that serves no custom runtime.
"""

from __future__ import annotations

from collections.abc import Callable

from inferpool.engine.ipc.messages import Kind
from inferpool.protocol.wire_format import WireFormat

Loader = Callable[[], WireFormat]


class UnknownWireFormat(LookupError):
    """A kind that has no wire format (a custom endpoint's frames, or no kind at all)."""


def _rest() -> WireFormat:
    from inferpool.protocol import rest_wire

    return rest_wire


def _grpc() -> WireFormat:
    from inferpool.protocol import grpc_wire

    return grpc_wire


def _rest_headers() -> WireFormat:
    from inferpool.protocol import rest_headers_wire

    return rest_headers_wire


def _grpc_headers() -> WireFormat:
    from inferpool.protocol import grpc_headers_wire

    return grpc_headers_wire


def _shared_memory() -> WireFormat:
    from inferpool.engine.worker import shm_wire

    return shm_wire


def _generate() -> WireFormat:
    from inferpool.protocol import generate_wire

    return generate_wire


LOADERS: dict[Kind, Loader] = {
    Kind.REST: _rest,
    Kind.GRPC: _grpc,
    Kind.REST_HEADERS: _rest_headers,
    Kind.GRPC_HEADERS: _grpc_headers,
    Kind.REST_STREAM: _rest,
    Kind.GRPC_STREAM: _grpc,
    Kind.GENERATE: _generate,
    Kind.GENERATE_STREAM: _generate,
    Kind.GRPC_STREAM_IN: _grpc,
    Kind.REST_SHM: _shared_memory,
    Kind.GRPC_SHM: _shared_memory,
}
# The kinds a worker answers without a wire format: a custom endpoint's call is framed by
# ``protocol/endpoints.py`` and handled by ``engine/worker/endpoints.py``.
NO_WIRE_FORMAT = frozenset({Kind.CUSTOM})
# Each kind's module once loaded: the hot path's lookup is one dict access.
_LOADED: dict[int, WireFormat] = {}


def wire_format(kind: int) -> WireFormat:
    """The wire format of ``kind``; UnknownWireFormat for a kind that has none."""
    loaded = _LOADED.get(kind)
    if loaded is None:
        loaded = _LOADED[kind] = _load(kind)
    return loaded


def _load(kind: int) -> WireFormat:
    try:
        named = Kind(kind)
    except ValueError:
        raise UnknownWireFormat(f"no wire format for request kind {kind}: no such kind") from None
    loader = LOADERS.get(named)
    if loader is None:
        raise UnknownWireFormat(f"no wire format for request kind {named.name} ({kind})")
    return loader()
