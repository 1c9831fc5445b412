"""A request message with its Compressed-Flag set (issue 37, point 7), on both gRPC servers.

gRPC's compression specification: a message whose Compressed-Flag is set in a call that
declares no ``grpc-encoding`` (or ``identity``) is ill-constructed and MUST fail with
INTERNAL; one compressed with an encoding the server does not support fails with
UNIMPLEMENTED. Both servers decode gzip and deflate; the builtin server answers another
encoding UNIMPLEMENTED, naming it, and grpcio answers an encoding name it does not know with
INTERNAL (grpcio's behaviour, not ours to change). Either way the call
fails alone: the connection, and the server, keep serving. The frames are hand-made
(``tests.support.h2client``), as no gRPC client sends such a message.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import pytest

from tests.support import Server
from tests.support.grpc import build_grpc_repository
from tests.support.h2client import Client, assert_serving
from tests.support.h2frames import (
    INFER,
    INTERNAL,
    OK,
    SERVICE,
    UNIMPLEMENTED,
    echo_typed,
    grpc_frame,
    request_headers,
    typed_output,
)

STREAM_INFER = SERVICE + b"ModelStreamInfer"


@pytest.fixture(scope="module", params=["builtin", "grpcio"])
def server(request, tmp_path_factory) -> Iterator[Server]:
    repository = build_grpc_repository(tmp_path_factory.mktemp("compressed-flag"))
    implementation = ("--grpc-implementation", request.param)
    with Server(repository, "--workers", "0", *implementation) as server:
        server.wait_ready()
        server.implementation = request.param
        yield server


def encoding(name: bytes | None) -> list[tuple[bytes, bytes]]:
    return [] if name is None else [(b"grpc-encoding", name)]


@pytest.mark.parametrize("declared", [None, b"identity"], ids=["no-encoding", "identity"])
@pytest.mark.parametrize("path", [None, STREAM_INFER], ids=["unary", "stream"])
def test_the_flag_without_an_encoding_is_internal_and_the_connection_serves_on(
    server: Server, declared: bytes | None, path: bytes | None
) -> None:
    headers = request_headers(path or INFER, extra=encoding(declared))
    with Client(server.grpc_port) as client:
        reply = client.call(b"", headers, raw_body=grpc_frame(echo_typed(5), compressed=1))
        assert reply.status == INTERNAL, (reply.status, reply.message)
        if server.implementation == "builtin":
            assert "flagged compressed" in reply.message, reply.message
        # The same connection answers the next call.
        after = client.call(echo_typed(41))
        assert after.status == OK and typed_output(after.response()) == [41]
    assert_serving(server)


def test_a_gzip_message_is_decoded_and_an_unknown_encoding_refused(server: Server) -> None:
    body = grpc_frame(gzip.compress(echo_typed(7)), compressed=1)
    with Client(server.grpc_port) as client:
        reply = client.call(b"", request_headers(extra=encoding(b"gzip")), raw_body=body)
        assert reply.status == OK and typed_output(reply.response()) == [7]
        unknown = client.call(b"", request_headers(extra=encoding(b"br")), raw_body=body)
        if server.implementation == "builtin":
            assert unknown.status == UNIMPLEMENTED, (unknown.status, unknown.message)
            assert "'br' is not supported" in unknown.message
        else:  # grpcio's own answer to an encoding it does not know
            assert unknown.status == INTERNAL, (unknown.status, unknown.message)
        # An uncompressed message in a call that declares gzip is plain: served.
        plain = client.call(echo_typed(8), request_headers(extra=encoding(b"gzip")))
        assert plain.status == OK, (plain.status, plain.message)
        assert typed_output(plain.response()) == [8]
    assert_serving(server)
