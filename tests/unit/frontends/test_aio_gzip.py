"""The grpc.aio server's response compression (``frontends/grpc/aio_gzip.py``): which
messages it sends uncompressed, with the settings on and off (``grpc_response_gzip`` is
off by default; ``gzip_enabled`` off turns it off too)."""

from __future__ import annotations

from inferpool.frontends.grpc.aio_gzip import OFF, aio_gzip, gzip_options
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.settings import ServerSettings


class Context:
    """What compression uses of a grpc.aio call context."""

    def __init__(self) -> None:
        self.uncompressed = 0

    def disable_next_message_compression(self) -> None:
        self.uncompressed += 1


class Serialising:
    """A response of inferpool's own codecs: it only serialises."""

    def __init__(self, size: int) -> None:
        self.size = size

    def SerializeToString(self) -> bytes:
        return b"x" * self.size


def test_on_messages_under_the_threshold_go_out_uncompressed() -> None:
    gzip = aio_gzip(ServerSettings(grpc_response_gzip=True, gzip_min_bytes=100))
    context = Context()
    gzip.small(context, 99)  # type: ignore[arg-type]
    gzip.small(context, 100)  # type: ignore[arg-type]
    assert context.uncompressed == 1
    gzip.small_message(context, pb.ServerLiveResponse(live=True))  # type: ignore[arg-type]
    gzip.small_message(context, Serialising(10))  # type: ignore[arg-type]
    gzip.small_message(context, Serialising(500))  # type: ignore[arg-type]
    assert context.uncompressed == 3
    assert gzip_options(ServerSettings(grpc_response_gzip=True)) == [
        ("grpc.default_compression_level", 1)
    ]


def test_off_leaves_every_message_alone() -> None:
    for off in (
        ServerSettings(gzip_min_bytes=100),  # the default: gRPC answers are not compressed
        ServerSettings(gzip_enabled=False, grpc_response_gzip=True, gzip_min_bytes=100),
    ):
        gzip = aio_gzip(off)
        assert gzip is OFF
        context = Context()
        gzip.small(context, 0)  # type: ignore[arg-type]
        gzip.small_message(context, Serialising(1))  # type: ignore[arg-type]
        assert context.uncompressed == 0
        assert gzip_options(off) == []


def test_on_with_no_threshold_compresses_every_message() -> None:
    gzip = aio_gzip(ServerSettings(grpc_response_gzip=True, gzip_min_bytes=0))
    context = Context()
    gzip.small(context, 0)  # type: ignore[arg-type]
    gzip.small_message(context, Serialising(0))  # type: ignore[arg-type]
    assert context.uncompressed == 0
