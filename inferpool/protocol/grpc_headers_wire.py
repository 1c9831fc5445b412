"""The gRPC wire format with the call's metadata in front (``Kind.GRPC_HEADERS``): a
custom runtime's request gets it as ``parameters.headers``, and the headers its response
sets come back in front of the response's body (see ``request_headers``)."""

from __future__ import annotations

from inferpool.protocol import grpc_wire
from inferpool.protocol.request_headers import with_headers, with_response_headers

decode = with_headers(grpc_wire.decode)
encode = with_response_headers(grpc_wire.encode)
