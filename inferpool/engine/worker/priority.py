"""The priority level a request's body asks for, read by the worker as it queues it.

The frontend hands over the level of the request's ``inferpool-priority`` header in the
slot header; when that is 0 the body's ``parameters.priority`` decides
(``protocol/priority.py``), for the kinds that carry one: V2 JSON and ModelInferRequest,
with or without the custom runtime's headers block or the table of shared-memory regions
in front.
"""

from __future__ import annotations

from inferpool.engine.ipc.messages import Kind
from inferpool.engine.ipc.shared_memory import unwrap as unwrap_regions
from inferpool.protocol.priority import body_level
from inferpool.protocol.request_headers import unwrap


def requested_level(kind: int, body: bytes, json_length: int | None) -> int:
    """The level ``body`` asks for (0: none, or a kind without parameters); BadRequest
    for a priority that is no whole number from 0 to 2**64 - 1."""
    if kind == _REST:
        return body_level(False, body, json_length)
    if kind == _GRPC:
        return body_level(True, body, None)
    if kind == _REST_HEADERS and b'"priority"' in body:
        return body_level(False, unwrap(body)[1], json_length)
    if kind == _GRPC_HEADERS and b"priority" in body:
        return body_level(True, unwrap(body)[1], None)
    if kind in _SHM and b"priority" in body:  # behind the table of shared-memory regions
        table, inner = unwrap_regions(body)
        return requested_level(table.kind, inner, None)
    return 0


# Plain ints: comparing with them costs a fraction of an IntEnum member's lookup.
_REST, _GRPC = int(Kind.REST), int(Kind.GRPC)
_REST_HEADERS, _GRPC_HEADERS = int(Kind.REST_HEADERS), int(Kind.GRPC_HEADERS)
_SHM = frozenset((int(Kind.REST_SHM), int(Kind.GRPC_SHM)))
