"""Compressed answers (issue 38, MLServer's ``gzip_enabled``, on by default): a REST
answer of ``--gzip-min-bytes`` or more goes out gzipped to a client that accepts gzip
(``Content-Encoding: gzip``, ``Vary: Accept-Encoding``) and decompresses to the plain
answer; a smaller one, a client that does not accept gzip and a server with the setting
off get plain JSON. gRPC: by default no response is compressed (as Triton and MLServer),
even for grpcio clients, which list gzip in every call's ``grpc-accept-encoding``; with
``--grpc-response-gzip`` the builtin server gzips a large ModelInfer response for a
client that lists gzip, and so does grpc.aio (``--grpc-implementation grpcio``,
``grpc/aio_gzip.py``); both implementations read gzip-compressed requests."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import orjson
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.support import Server, build_iris_repository, iris_data
from tests.support.h2client import Client
from tests.support.h2frames import (
    INTERNAL,
    OK,
    SERVICE,
    UNIMPLEMENTED,
    grpc_frame,
    request_headers,
)
from tests.support.relay import CountingRelay

MODEL = "iris-logreg"
INFER = f"/v2/models/{MODEL}/infer"
ROWS = np.tile(iris_data()[0], (14, 1))  # 2100 rows: about 60 KB of probabilities
ACCEPT_GZIP = (b"grpc-accept-encoding", b"identity,gzip")


def rest_body(rows: np.ndarray, binary: bool = False) -> bytes:
    tensor = {"name": "x", "shape": list(rows.shape), "datatype": "FP64", "data": rows.tolist()}
    output: dict = {"name": "predict_proba"}
    if binary:
        output["parameters"] = {"binary_data": True}
    return orjson.dumps({"inputs": [tensor], "outputs": [output]})


def grpc_request(rows: np.ndarray) -> bytes:
    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="x", datatype="FP64", shape=list(rows.shape))
    tensor.contents.fp64_contents.extend(rows.ravel().tolist())
    request.outputs.add(name="predict_proba")
    return request.SerializeToString()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory):
    return build_iris_repository(tmp_path_factory.mktemp("gzip-answers"))


def serving(repository, *args: str, env: dict | None = None) -> Iterator[Server]:
    with Server(repository, "--workers", "1", *args, env=env) as server:
        server.wait_ready()
        yield server


@pytest.fixture(scope="module")
def server(repository) -> Iterator[Server]:
    yield from serving(repository)


@pytest.fixture(scope="module")
def aio_server(repository) -> Iterator[Server]:
    yield from serving(repository, "--grpc-implementation", "grpcio")


@pytest.fixture(scope="module")
def grpc_gzip_server(repository) -> Iterator[Server]:
    yield from serving(repository, "--grpc-response-gzip")


@pytest.fixture(scope="module")
def aio_grpc_gzip_server(repository) -> Iterator[Server]:
    yield from serving(repository, "--grpc-implementation", "grpcio", "--grpc-response-gzip")


# gzip_enabled off turns gRPC's compression off too, --grpc-response-gzip or not.
@pytest.fixture(scope="module")
def off_server(repository) -> Iterator[Server]:
    yield from serving(repository, "--grpc-response-gzip", env={"INFERPOOL_GZIP_ENABLED": "false"})


@pytest.fixture(scope="module")
def aio_off_server(repository) -> Iterator[Server]:
    off = {"INFERPOOL_GZIP_ENABLED": "false"}
    args = ("--grpc-implementation", "grpcio", "--grpc-response-gzip")
    yield from serving(repository, *args, env=off)


@pytest.fixture(params=["builtin", "grpcio"])
def grpc_server(request: pytest.FixtureRequest) -> Server:
    """Each gRPC implementation's server, gRPC response gzip on."""
    name = "grpc_gzip_server" if request.param == "builtin" else "aio_grpc_gzip_server"
    return request.getfixturevalue(name)


def post(server: Server, body: bytes, accept: str) -> httpx.Response:
    headers = {"Content-Type": "application/json", "Accept-Encoding": accept}
    response = httpx.post(server.url + INFER, content=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response


# -- REST ---------------------------------------------------------------------------------
def test_a_large_answer_is_gzipped_and_decompresses_to_the_plain_one(server):
    body = rest_body(ROWS)
    plain = post(server, body, "identity")
    assert "content-encoding" not in plain.headers
    assert plain.headers["vary"] == "accept-encoding"  # its form depends on the header
    assert int(plain.headers["content-length"]) == len(plain.content) > 50_000
    for accept in ("gzip", "gzip, deflate, br", "br;q=1.0, gzip;q=0.5", "*"):
        zipped = post(server, body, accept)
        assert zipped.headers["content-encoding"] == "gzip", accept
        assert zipped.headers["vary"] == "accept-encoding"
        # On the wire: the compressed bytes, their length in Content-Length.
        wire = int(zipped.headers["content-length"])
        assert wire == zipped.num_bytes_downloaded < len(plain.content) // 2
        # httpx inflated it: the same answer (but for its generated id).
        assert orjson.loads(zipped.content)["outputs"] == orjson.loads(plain.content)["outputs"]


@pytest.mark.parametrize("accept", ["identity", "gzip;q=0", "deflate", "*;q=0", ""])
def test_a_client_that_does_not_accept_gzip_gets_plain_json(server, accept):
    response = post(server, rest_body(ROWS), accept)
    assert "content-encoding" not in response.headers
    assert response.num_bytes_downloaded == len(response.content) > 50_000


def test_a_small_answer_is_not_compressed(server):
    response = post(server, rest_body(ROWS[:2]), "gzip")
    assert len(response.content) < 1024  # under the default --gzip-min-bytes
    assert "content-encoding" not in response.headers
    assert "vary" not in response.headers


def test_the_raw_bytes_are_a_gzip_stream(server):
    with httpx.Client(timeout=60) as client:
        request = client.build_request(
            "POST",
            server.url + INFER,
            content=rest_body(ROWS),
            headers={"Accept-Encoding": "gzip", "Content-Type": "application/json"},
        )
        response = client.send(request, stream=True)
        raw = b"".join(response.iter_raw())
    assert raw[:2] == b"\x1f\x8b"  # gzip's magic
    assert len(orjson.loads(gzip.decompress(raw))["outputs"][0]["data"]) == 3 * len(ROWS)


def test_tritonclient_asks_for_gzip_answers(server):
    import tritonclient.http as triton

    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    expected = None
    for binary in (False, True):
        for compression in (None, "gzip"):
            x = triton.InferInput("x", list(ROWS.shape), "FP64")
            x.set_data_from_numpy(ROWS, binary_data=binary)
            result = client.infer(
                MODEL,
                [x],
                outputs=[triton.InferRequestedOutput("predict_proba", binary_data=binary)],
                response_compression_algorithm=compression,
            )
            probabilities = result.as_numpy("predict_proba")
            assert probabilities.shape == (len(ROWS), 3)
            if expected is None:
                expected = probabilities
            np.testing.assert_array_equal(probabilities, expected)


@pytest.mark.parametrize("implementation", ["builtin", "grpcio"])
def test_with_the_setting_off_nothing_is_compressed(request, implementation):
    off_server = request.getfixturevalue(
        "off_server" if implementation == "builtin" else "aio_off_server"
    )
    response = post(off_server, rest_body(ROWS), "gzip")
    assert "content-encoding" not in response.headers
    assert response.num_bytes_downloaded == len(response.content) > 50_000
    with Client(off_server.grpc_port) as client:
        reply = client.call(grpc_request(ROWS), request_headers(extra=[ACCEPT_GZIP]))
        assert b"grpc-encoding" not in dict(reply.headers)
        assert len(reply.response().outputs[0].contents.fp64_contents) == 3 * len(ROWS)


# -- gRPC ---------------------------------------------------------------------------------
def inflated(data: bytes) -> pb.ModelInferResponse:
    """The one response message of a DATA payload flagged compressed, inflated."""
    assert data[0] == 1, "the response message is not flagged compressed"
    assert int.from_bytes(data[1:5], "big") == len(data) - 5
    return pb.ModelInferResponse.FromString(gzip.decompress(data[5:]))


def same_answer(one: pb.ModelInferResponse, other: pb.ModelInferResponse) -> bool:
    """Equal but for the id each answer gets."""
    return one.model_name == other.model_name and one.outputs == other.outputs


def test_a_large_grpc_response_is_gzipped_for_a_client_that_accepts_it(grpc_server):
    with Client(grpc_server.grpc_port) as client:
        plain = client.call(grpc_request(ROWS)).response()  # no grpc-accept-encoding
        reply = client.call(grpc_request(ROWS), request_headers(extra=[ACCEPT_GZIP]))
        assert reply.status == OK, reply.message
        assert dict(reply.headers)[b"grpc-encoding"] == b"gzip"
        assert len(reply.data) < plain.ByteSize() // 2
        assert same_answer(inflated(bytes(reply.data)), plain)
        # A small response stays identity.
        small = client.call(grpc_request(ROWS[:2]), request_headers(extra=[ACCEPT_GZIP]))
        assert small.data[0] == 0
        assert len(small.response().outputs[0].contents.fp64_contents) == 6


def stream_messages(data: bytes) -> list[tuple[int, bytes]]:
    """The (flag, payload) of each length-prefixed message of a stream's DATA."""
    messages = []
    while data:
        length = int.from_bytes(data[1:5], "big")
        messages.append((data[0], data[5 : 5 + length]))
        data = data[5 + length :]
    return messages


def test_stream_answers_are_gzipped_for_a_client_that_accepts_it(grpc_server):
    stream = SERVICE + b"ModelStreamInfer"
    requests = grpc_frame(grpc_request(ROWS)) + grpc_frame(grpc_request(ROWS[:2]))
    with Client(grpc_server.grpc_port) as client:
        reply = client.call(b"", request_headers(stream, extra=[ACCEPT_GZIP]), raw_body=requests)
        assert reply.status == OK, reply.message
        assert dict(reply.headers)[b"grpc-encoding"] == b"gzip"
        (big_flag, big), (small_flag, small) = stream_messages(bytes(reply.data))
        assert (big_flag, small_flag) == (1, 0)  # the small answer stays identity
        answer = pb.ModelStreamInferResponse.FromString(gzip.decompress(big)).infer_response
        assert len(answer.outputs[0].contents.fp64_contents) == 3 * len(ROWS)
        answer = pb.ModelStreamInferResponse.FromString(small).infer_response
        assert len(answer.outputs[0].contents.fp64_contents) == 6
        # Without grpc-accept-encoding: identity throughout.
        plain = client.call(b"", request_headers(stream), raw_body=requests)
        assert b"grpc-encoding" not in dict(plain.headers)
        assert [flag for flag, _ in stream_messages(bytes(plain.data))] == [0, 0]


@pytest.mark.parametrize("implementation", ["builtin", "grpcio"])
def test_grpcio_clients_send_and_receive_gzip(server, aio_server, implementation):
    target = server if implementation == "builtin" else aio_server
    answers = []
    for compression in (grpc.Compression.NoCompression, grpc.Compression.Gzip):
        with grpc.insecure_channel(target.grpc_address, compression=compression) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            request = pb.ModelInferRequest.FromString(grpc_request(ROWS))
            answers.append(stub.ModelInfer(request, timeout=60))
    assert same_answer(answers[0], answers[1])
    assert len(answers[0].outputs[0].contents.fp64_contents) == 3 * len(ROWS)


@pytest.mark.parametrize("implementation", ["builtin", "grpcio"])
def test_a_grpcio_client_receives_the_large_answer_compressed_only_when_asked(
    request, implementation
):
    """What a real grpcio client (it sends ``grpc-accept-encoding: identity,deflate,gzip``)
    receives on the wire for the same answer, from a server with --grpc-response-gzip and
    one with the defaults: a small fraction of the bytes, decoding to the same answer, and
    the plain message."""
    names = (
        ("grpc_gzip_server", "server")
        if implementation == "builtin"
        else ("aio_grpc_gzip_server", "aio_server")
    )
    received, answers = [], []
    for name in names:
        target = request.getfixturevalue(name)
        with CountingRelay(target.grpc_port) as relay:
            with grpc.insecure_channel(f"127.0.0.1:{relay.port}") as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                request_message = pb.ModelInferRequest.FromString(grpc_request(ROWS))
                answers.append(stub.ModelInfer(request_message, timeout=60))
            received.append(relay.received)
    assert same_answer(answers[0], answers[1])
    assert received[1] > answers[1].ByteSize() > 50_000  # the defaults: the plain message
    assert received[0] < received[1] // 2, received  # --grpc-response-gzip: gzipped


def test_the_builtin_server_reads_gzip_requests(server):
    message = grpc_request(ROWS)
    with Client(server.grpc_port) as client:
        plain = client.call(message).response()
        for encoding, compress in ((b"gzip", gzip.compress), (b"deflate", _deflate)):
            headers = request_headers(extra=[(b"grpc-encoding", encoding)])
            body = grpc_frame(compress(message), compressed=1)
            assert same_answer(client.call(message, headers, raw_body=body).response(), plain)
        # Bad ones get a status naming the problem; the connection keeps serving.
        cases = [
            (b"gzip", grpc_frame(b"not gzip at all", compressed=1), INTERNAL, "corrupt"),
            (b"gzip", grpc_frame(gzip.compress(message)[:-9], compressed=1), INTERNAL, "trunc"),
            (b"br", grpc_frame(message, compressed=1), UNIMPLEMENTED, "'br' is not supported"),
            (None, grpc_frame(gzip.compress(message), compressed=1), INTERNAL, "grpc-encoding"),
        ]
        for encoding, body, status, words in cases:
            extra = [] if encoding is None else [(b"grpc-encoding", encoding)]
            reply = client.call(message, request_headers(extra=extra), raw_body=body)
            assert reply.status == status and words in reply.message, (encoding, reply.message)
        assert same_answer(client.call(message).response(), plain)


def _deflate(data: bytes) -> bytes:
    import zlib

    return zlib.compress(data)
