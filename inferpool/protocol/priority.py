"""A request's priority (Triton's schedule-policy ``priority``): where it is read, what
values it takes, and how it travels from the frontend to the worker.

A request asks for a priority with its ``parameters.priority`` (REST JSON, or a
ModelInferRequest's ``parameters`` map: ``uint64_param`` or ``int64_param``) or with the
``inferpool-priority`` header (gRPC: the same metadata key), which wins when both are
given. The value is a whole number from 0 to 2**64 - 1: 0 asks for the model's default
level, 1 is the highest level, larger numbers are lower ones; levels past ``MAX_LEVEL``
rank as ``MAX_LEVEL`` (the slot header carries 16 bits). Anything else is a 400 /
INVALID_ARGUMENT.

The frontend reads the header only (it never parses a body): ``LEVEL`` holds it for the
dispatcher, which packs it into the request's slot header. The worker reads the body's
parameter when the header gave none (``body_level``), at enqueue, where it orders its
queue by level (``engine/worker/batching.py``). ``body_level`` looks for the word first,
so a body without it costs one substring search (REST) or a walk over the message's
top-level fields (gRPC).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import orjson

from inferpool.errors import BadRequest
from inferpool.protocol.protowire import read_varint

HEADER = "inferpool-priority"
MAX_LEVEL = 0xFFFF
_MAX_PRIORITY = 2**64 - 1
# The level the frontend read from the request's header, for the dispatcher (0: none).
LEVEL: ContextVar[int] = ContextVar("inferpool_priority", default=0)

_PARAMETERS = 4  # ModelInferRequest.parameters (map<string, InferParameter>)
_INT64, _STRING, _UINT64 = 2, 3, 5  # InferParameter's fields that may carry it
# Messages up to this size are searched for the word before their fields are walked.
_SEARCHED = 16 * 1024


def level_of(value: Any, where: str = "parameters.priority") -> int:
    """The level a priority value stands for (0: the model's default); BadRequest for
    anything but a whole number from 0 to 2**64 - 1."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_PRIORITY:
        return min(value, MAX_LEVEL)
    shown = repr(value)[:40]
    raise BadRequest(
        f"{where} must be a whole number from 0 (the model's default) to 2**64-1 "
        f"(1 is the highest priority), not {shown}"
    )


def header_level(raw: bytes | str) -> int:
    """The level of an ``inferpool-priority`` header (or metadata) value."""
    text = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    text = text.strip()
    value: Any = int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else text
    return level_of(value, HEADER)


def body_level(kind_is_grpc: bool, body: bytes, json_length: int | None) -> int:
    """The level a request body's ``parameters.priority`` asks for (0: none given)."""
    if kind_is_grpc:
        return _grpc_level(body)
    document = body if json_length is None else body[:json_length]
    if b'"priority"' not in document:
        return 0
    try:
        parsed = orjson.loads(document)
    except orjson.JSONDecodeError:
        return 0  # the decode answers for the body
    parameters = parsed.get("parameters") if isinstance(parsed, dict) else None
    if not isinstance(parameters, dict) or "priority" not in parameters:
        return 0
    return level_of(parameters["priority"])


def _grpc_level(body: bytes) -> int:
    """``parameters["priority"]`` of a serialized ModelInferRequest (0: none): its
    top-level fields walked, only the map's entries read."""
    if len(body) <= _SEARCHED and b"priority" not in body:
        return 0  # a small message: one search costs less than the walk
    level = 0
    try:
        for entry in _fields(body, _PARAMETERS):
            if b"priority" in entry:
                found = _entry_level(entry)
                if found is not None:
                    level = found  # the last entry wins, as in a parsed map
    except ValueError:
        return 0  # not a message: the decode answers for it
    return level


def _entry_level(entry: bytes) -> int | None:
    """A map entry's level if its key is ``priority``, else None."""
    fields = dict(_all_fields(entry))
    if fields.get(1) != b"priority":
        return None
    value = fields.get(2, b"")
    parameter = dict(_all_fields(value if isinstance(value, bytes) else b""))
    if _UINT64 in parameter:
        return level_of(parameter[_UINT64])
    if _INT64 in parameter:
        number = parameter[_INT64]
        assert isinstance(number, int)
        return level_of(number - 2**64 if number >= 2**63 else number)
    if _STRING in parameter:
        value = parameter[_STRING]
        shown = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return level_of(shown)
    return level_of(None)


def _fields(data: bytes, wanted: int) -> list[bytes]:
    """Every length-delimited top-level field numbered ``wanted`` (only those are copied:
    the inputs and raw contents are skipped by their length)."""
    return [value for _, value in _all_fields(data, wanted) if isinstance(value, bytes)]


def _all_fields(data: bytes, wanted: int | None = None) -> list[tuple[int, bytes | int]]:
    """Each top-level field (those numbered ``wanted`` when given): (number, its bytes when
    length-delimited, else a varint's value); other wire types are skipped."""
    fields: list[tuple[int, bytes | int]] = []
    pos, end = 0, len(data)
    while pos < end:
        key, pos = read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = read_varint(data, pos)
            if wanted is None or number == wanted:
                fields.append((number, value))
        elif wire_type == 2:
            length, pos = read_varint(data, pos)
            if wanted is None or number == wanted:
                fields.append((number, data[pos : pos + length]))
            pos += length
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
    if pos != end:
        raise ValueError("truncated message")
    return fields
