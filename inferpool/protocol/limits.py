"""The decoding limits of one process: what a request may ask a decoder to allocate.

Decoders (REST JSON, Triton binary tensors, gRPC) run in the workers, or in the server
process with ``--workers 0``. The server passes its settings to each worker when it is
forked (``configure``); decoders read them with ``current()`` and check a request's
declared shapes and datatypes against the bytes present before allocating anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    max_tensor_elements: int = 2**26
    max_request_tensor_bytes: int = 256 * 1024 * 1024
    max_json_depth: int = 64
    # Read where no frontend stands before the decoder: a warm-up sample's request file.
    max_body_bytes: int = 65 * 1024 * 1024  # as ServerSettings: 64 MiB + 1 MiB of headers

    @classmethod
    def from_settings(cls, settings: Any) -> DecodeLimits:
        """The limits named in a ``ServerSettings``."""
        return cls(
            max_tensor_elements=settings.max_tensor_elements,
            max_request_tensor_bytes=settings.max_request_tensor_bytes,
            max_json_depth=settings.max_json_depth,
            max_body_bytes=settings.max_body_bytes,
        )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


_current = DecodeLimits()


def configure(limits: DecodeLimits) -> None:
    """Set this process's limits (at worker start, or by the in-process client)."""
    global _current
    _current = limits


def current() -> DecodeLimits:
    return _current
