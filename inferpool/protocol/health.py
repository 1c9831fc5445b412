"""grpc.health.v1's two messages (``health.proto``), encoded and decoded by hand.

Each message has one field, so a few lines of protobuf wire format replace generated
code, and the messages depend on no protobuf runtime version. The classes have the
generated messages' ``FromString`` / ``SerializeToString``, so both gRPC servers carry
them like any other typed message (grpc.aio takes them as (de)serializers).
"""

from __future__ import annotations

import enum

from inferpool.protocol.protowire import scan_fields


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
        try:
            service = scan_fields(data, (1,)).get(1, b"")
        except ValueError as exc:
            raise MalformedMessage(str(exc)) from None
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
