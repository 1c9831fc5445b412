"""Response compression on the grpc.aio server (``--grpc-implementation grpcio``).

The same rule as the builtin server's (``compression.py``): with ``gzip_enabled`` and
``grpc_response_gzip`` (off by default), a
response message of at least ``gzip_min_bytes`` goes out gzipped when the call's
``grpc-accept-encoding`` lists gzip; smaller ones, and every one to a client that did not
ask, stay identity.

grpcio's core consumes ``grpc-accept-encoding`` (the handler never sees it), and
grpc.aio's per-call ``set_compression`` is not applied to a unary answer (grpcio 1.85).
What works is a server-wide compression *level* (``options``): core then picks, per call,
the best algorithm the client accepts (gzip; deflate for a client that lists deflate and
not gzip; none for a client that lists neither), and says so in ``grpc-encoding``. Each
message under the threshold is then sent uncompressed (``small``), which gRPC allows in a
compressing call (its flag 0). Core compresses at zlib's default level: ``gzip_level``
applies to the builtin server and REST only.
"""

from __future__ import annotations

from typing import Any

import grpc

from inferpool.frontends.grpc.compression import compresses_grpc
from inferpool.settings import ServerSettings

# grpc_compression_level's GRPC_COMPRESS_LEVEL_LOW: the first algorithm the peer accepts.
_LEVEL_LOW = 1


class AioGzip:
    """The grpc.aio server's response compression: which messages go out uncompressed.
    With the setting off (``OFF``: no threshold) it leaves every message alone, so that
    the handlers call it without asking first."""

    def __init__(self, min_bytes: int = 0) -> None:
        self.min_bytes = min_bytes

    def small_message(self, context: grpc.aio.ServicerContext, message: Any) -> None:
        """``small`` for a response message: protobuf's or one of inferpool's own codecs
        (health), which only serialises."""
        if not self.min_bytes:
            return  # nothing is under no threshold: not even its size is needed
        size = getattr(message, "ByteSize", None)
        self.small(context, size() if size is not None else len(message.SerializeToString()))

    def small(self, context: grpc.aio.ServicerContext, size: int) -> None:
        """Before a call sends a message of ``size`` bytes: under the threshold it goes
        out uncompressed."""
        if size < self.min_bytes:
            context.disable_next_message_compression()


OFF = AioGzip()


def aio_gzip(settings: ServerSettings) -> AioGzip:
    return AioGzip(settings.gzip_min_bytes) if compresses_grpc(settings) else OFF


def gzip_options(settings: ServerSettings) -> list[tuple[str, int]]:
    """The server options that compress answers for clients that accept it."""
    return [("grpc.default_compression_level", _LEVEL_LOW)] if compresses_grpc(settings) else []
