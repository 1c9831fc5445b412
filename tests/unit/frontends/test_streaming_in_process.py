"""Streaming on an in-process engine (no server process, no worker): REST ``infer_stream``,
``generate_stream`` and ``generate`` through the app (``rest/stream.py``), and
ModelStreamInfer on the builtin gRPC server in this process (``grpc/h2_stream.py``,
``grpc/stream_input.py``) driven by hand-made HTTP/2 frames. The same models on live
servers of both gRPC implementations, with and without workers (a client leaving, the
model's timeout, a worker dying): tests/e2e/test_streaming.py (not in tox -e lowest)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from inferpool.engine.inprocess import InProcessClient
from inferpool.frontends.rest.app import build_app
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.settings import ServerSettings
from tests.e2e.test_streaming import (
    answer_value,
    counter_body,
    repository,
    stream_request,
    value,
)
from tests.support.h2client import RawConnection
from tests.support.h2frames import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    OK,
    SERVICE,
    frame,
    grpc_frame,
    request_headers,
)
from tests.unit.frontends.test_grpc_h2_calls import LoopThread

STREAM = SERVICE + b"ModelStreamInfer"


def events(body: str) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Iterator[Any]:
    """The e2e file's models; the counter's files (gates) in a folder of their own."""
    files = tmp_path_factory.mktemp("stream-files")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STREAM_TEST_DIR", str(files))
        yield repository(tmp_path_factory.mktemp("streaming"))


@pytest.fixture(scope="module")
def rest(models) -> dict[str, httpx.Response]:
    async def main() -> dict[str, httpx.Response]:
        settings = ServerSettings(model_repository=models, workers=0, load_probe=False)
        client = InProcessClient(settings)
        await client.start()
        try:
            transport = httpx.ASGITransport(app=build_app(client))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                stream = "/v2/models/{}/infer_stream"
                double = {"inputs": [{"name": "x", "datatype": "INT64", "shape": [2],
                                      "data": [3, 4]}]}  # fmt: skip
                asks = {
                    "chunks": http.post(stream.format("counter"), json=counter_body(3)),
                    "versioned": http.post(
                        "/v2/models/counter/versions/1/infer_stream", json=counter_body(1)
                    ),
                    "one": http.post(stream.format("double"), json=double),
                    "fails": http.post(stream.format("counter"), json=counter_body(4, fail_at=2)),
                    "fails first": http.post(
                        stream.format("counter"), json=counter_body(3, fail_at=0)
                    ),
                    "missing": http.post(stream.format("nope"), json={}),
                    "bad": http.post(stream.format("counter"), content=b"{"),
                    "binary": http.post(
                        stream.format("counter"),
                        content=b"{}",
                        headers={"inference-header-content-length": "2"},
                    ),
                    "tokens": http.post(
                        "/v2/models/tokens/generate_stream", json={"text_input": "the quick fox"}
                    ),
                    "generate": http.post(
                        "/v2/models/tokens/generate", json={"text_input": "the quick fox"}
                    ),
                    "generate missing": http.post("/v2/models/nope/generate", json={}),
                }
                return {name: await ask for name, ask in asks.items()}
        finally:
            await client.close()

    return asyncio.run(main())


def test_infer_stream_sends_each_chunk(rest) -> None:
    chunks = rest["chunks"]
    assert chunks.status_code == 200
    assert chunks.headers["content-type"] == "text/event-stream"
    received = events(chunks.text)
    assert [value(e) for e in received] == [0, 1, 2]
    assert len({e["id"] for e in received}) == 1 == len({chunks.headers["x-request-id"]})
    versioned = rest["versioned"]  # the versioned route; the model has no version 1
    assert versioned.status_code == 404 and "error" in versioned.json(), versioned.text
    (only,) = events(rest["one"].text)  # a model that does not stream: one event
    assert only["outputs"][0]["data"] == [6, 8]


def test_errors_mid_stream_and_before_it(rest) -> None:
    received = events(rest["fails"].text)
    assert [value(e) for e in received[:2]] == [0, 1]
    assert received[2] == {"error": "model 'counter' raised ValueError: chunk 2 failed"}
    assert len(received) == 3
    first = rest["fails first"]
    assert first.status_code == 500
    assert first.json() == {"error": "model 'counter' raised ValueError: chunk 0 failed"}
    assert rest["missing"].status_code == 404
    assert rest["missing"].json() == {"error": "model 'nope' not found"}
    assert rest["bad"].status_code == 400
    binary = rest["binary"]
    assert binary.status_code == 400
    assert binary.json()["error"] == (
        "binary tensors (Inference-Header-Content-Length) cannot stream"
    )


def test_generate_stream_and_generate(rest) -> None:
    received = events(rest["tokens"].text)
    assert [e["text_output"] for e in received] == ["the", "quick", "fox"]
    assert received[0]["model_name"] == "tokens"
    assert rest["generate"].status_code == 200
    assert rest["generate"].json()["text_output"] == "THE QUICK FOX"
    assert rest["generate missing"].status_code == 404


# -- ModelStreamInfer on the builtin gRPC server -------------------------------------------
def stream_messages(data: bytes) -> list[pb.ModelStreamInferResponse]:
    out, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos + 1 : pos + 5], "big")
        out.append(pb.ModelStreamInferResponse.FromString(bytes(data[pos + 5 : pos + 5 + length])))
        pos += 5 + length
    return out


@pytest.fixture(scope="module")
def grpc_server(models) -> Iterator[LoopThread]:
    running = LoopThread(models)
    try:
        yield running
    finally:
        running.stop()


def test_model_stream_infer_answers_each_request_in_turn(grpc_server) -> None:
    requests = [
        stream_request("counter", [3, -1, 0, 0, 0], "streamed"),
        stream_request("double", [21]),
        stream_request("nope", [1]),
        stream_request("counter", [3, 1, 0, 0, 0]),
    ]
    with RawConnection(grpc_server.port) as connection:
        block = connection.block(request_headers(STREAM, extra=((b"grpc-timeout", b"20S"),)))
        connection.send(frame(HEADERS, END_HEADERS, 1, block))
        body = b"".join(grpc_frame(r.SerializeToString()) for r in requests)
        connection.send(frame(DATA, 0, 1, body[:7]), frame(DATA, END_STREAM, 1, body[7:]))
        reply = connection.reply(1)
    assert reply.status == OK, reply.message
    messages = stream_messages(bytes(reply.data))
    assert [answer_value(m) for m in messages[:3]] == [0, 1, 2]
    assert messages[0].infer_response.id == "streamed"
    assert answer_value(messages[3]) == 42
    assert messages[4].error_message == "model 'nope' not found"
    assert answer_value(messages[5]) == 0
    assert messages[6].error_message == "model 'counter' raised ValueError: chunk 1 failed"
    assert len(messages) == 7


def test_model_stream_infer_refuses_a_message_it_cannot_read(grpc_server) -> None:
    with RawConnection(grpc_server.port) as connection:
        block = connection.block(request_headers(STREAM))
        connection.send(frame(HEADERS, END_HEADERS, 1, block))
        # Flagged compressed, with no grpc-encoding: the call ends INTERNAL.
        connection.send(frame(DATA, END_STREAM, 1, b"\x01\x00\x00\x00\x01x"))
        reply = connection.reply(1)
    assert reply.status == 13  # INTERNAL
