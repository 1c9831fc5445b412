"""The gRPC wire format with the call's metadata in front (``Kind.GRPC_HEADERS``): a
custom runtime's request gets it as ``parameters.headers`` (see ``request_headers``)."""

from __future__ import annotations

from inferpool.protocol import grpc_wire
from inferpool.protocol.request_headers import with_headers

decode = with_headers(grpc_wire.decode)
encode = grpc_wire.encode
