"""The REST wire format with the request's headers in front (``Kind.REST_HEADERS``): a
custom runtime's request gets them as ``parameters.headers``, and the headers its response
sets come back in front of the response's body (see ``request_headers``)."""

from __future__ import annotations

from inferpool.protocol import rest_wire
from inferpool.protocol.request_headers import with_headers, with_response_headers

decode = with_headers(rest_wire.decode)
encode = with_response_headers(rest_wire.encode)
