"""grpc.health.v1's two messages (``health.proto``), encoded and decoded by hand.

Each message has one field, so a few lines of protobuf wire format replace generated
code, and the messages depend on no protobuf runtime version. The classes have the
generated messages' ``FromString`` / ``SerializeToString``, so both gRPC servers carry
them like any other typed message (grpc.aio takes them as (de)serializers).
"""

from __future__ import annotations

import enum


class ServingStatus(enum.IntEnum):
    """``HealthCheckResponse.ServingStatus``."""

    UNKNOWN = 0
    SERVING = 1
    NOT_SERVING = 2
    SERVICE_UNKNOWN = 3  # Watch only: Check answers NOT_FOUND instead


class MalformedMessage(ValueError):
    """Bytes that are not a HealthCheckRequest."""


class HealthCheckRequest:
    """``HealthCheckRequest{string service = 1}``."""

    __slots__ = ("service",)

    def __init__(self, service: str = "") -> None:
        self.service = service

    @classmethod
    def FromString(cls, data: bytes) -> HealthCheckRequest:
        """Parse as protobuf does: unknown fields skipped, the last ``service`` wins."""
        service = b""
        pos, end = 0, len(data)
        while pos < end:
            key, pos = _varint(data, pos)
            number, wire_type = key >> 3, key & 7
            if number == 0:
                raise MalformedMessage("field number 0")
            if wire_type == 0:
                _, pos = _varint(data, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 2:
                length, pos = _varint(data, pos)
                if number == 1:
                    service = data[pos : pos + length]
                pos += length
            elif wire_type == 5:
                pos += 4
            else:  # groups (3, 4) are proto2's; 6 and 7 do not exist
                raise MalformedMessage(f"unsupported wire type {wire_type}")
        if pos != end:
            raise MalformedMessage("truncated message")
        try:
            return cls(service.decode())
        except UnicodeDecodeError:
            raise MalformedMessage("service is not UTF-8") from None


class HealthCheckResponse:
    """``HealthCheckResponse{ServingStatus status = 1}``."""

    __slots__ = ("status",)

    def __init__(self, status: ServingStatus) -> None:
        self.status = status

    def SerializeToString(self) -> bytes:
        return ENCODED[self.status]


# Every response there can be, encoded once (proto3 leaves the default, 0, out).
ENCODED = {status: b"\x08" + bytes([status]) if status else b"" for status in ServingStatus}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise MalformedMessage("truncated or overlong varint")
