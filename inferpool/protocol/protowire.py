"""A minimal protobuf wire reader: the length-delimited top-level fields a caller asks for,
read straight from a message's bytes without parsing the rest.

The gRPC frontend routes a ModelInferRequest by its ``model_name`` and ``model_version``
with it, and the health service reads a HealthCheckRequest: neither needs a generated
class or a full parse for that. The gRPC decoder takes a large request's raw contents out
of it as views (``split_field``) before parsing the rest.
"""

from __future__ import annotations

from collections.abc import Container


def scan_fields(data: bytes, wanted: Container[int]) -> dict[int, bytes]:
    """The bytes of each length-delimited top-level field numbered in ``wanted``.

    Every field is walked and skipped by its length; as protobuf parsing does, the last
    occurrence of a field wins. ``ValueError`` saying why for bytes that are no message.
    """
    fields: dict[int, bytes] = {}
    pos, end = 0, len(data)
    while pos < end:
        key, pos = read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire_type == 0:
            _, pos = read_varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 2:
            length, pos = read_varint(data, pos)
            if number in wanted:
                fields[number] = data[pos : pos + length]
            pos += length
        elif wire_type == 5:
            pos += 4
        else:  # groups (3, 4) are proto2's; 6 and 7 do not exist
            raise ValueError(f"unsupported wire type {wire_type}")
    if pos != end:
        raise ValueError("truncated message")
    return fields


def split_field(data: bytes, number: int) -> tuple[bytes, list[memoryview]]:
    """The message without its length-delimited field ``number``, and a view of each
    occurrence of that field's value, in order (a large ``raw_input_contents`` read in
    place rather than copied by a parse). ``ValueError`` for bytes that are no message."""
    view = memoryview(data)
    kept: list[memoryview] = []
    found: list[memoryview] = []
    pos, end, start = 0, len(data), 0
    while pos < end:
        field_start = pos
        key, pos = read_varint(data, pos)
        if key >> 3 == 0:
            raise ValueError("field number 0")
        if key & 7 != 2:
            pos = _skip(data, pos, key & 7)
            continue
        length, pos = read_varint(data, pos)
        if key >> 3 == number:
            kept.append(view[start:field_start])
            found.append(view[pos : pos + length])
            start = pos + length
        pos += length
    if pos != end:
        raise ValueError("truncated message")
    kept.append(view[start:end])
    return b"".join(kept), found


def _skip(data: bytes, pos: int, wire_type: int) -> int:
    """The position after a value of ``wire_type`` 0, 1 or 5 at ``pos``."""
    if wire_type == 0:
        return read_varint(data, pos)[1]
    if wire_type == 1:
        return pos + 8
    if wire_type == 5:
        return pos + 4
    raise ValueError(f"unsupported wire type {wire_type}")  # groups (3, 4) are proto2's


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated or overlong varint")
