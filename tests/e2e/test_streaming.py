"""Streaming end to end: a runtime's ``predict_stream`` over REST ``infer_stream`` /
``generate_stream`` (Server-Sent Events) and gRPC ``ModelStreamInfer`` (both gRPC
servers), with 0 and 2 workers; a runtime without it; errors before and during a stream;
the client going away (the generator is closed); the model timeout; a worker dying
mid-stream; an unknown gRPC method failing at once."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, write_custom_model
from tests.support.grpc import SETUPS, needs_pool

# x = [count, fail_at, tag, pause, crash]: ``count`` chunks (0, 1, ...); chunk ``fail_at``
# raises; with a ``tag``, chunk 1 waits for the file gate-<tag> and the generator writes
# closed-<tag> (the chunks it handed out) when it is closed; ``pause`` seconds before chunk
# 1; ``crash``: the worker exits at chunk 1.
COUNTER = """
    import asyncio
    import os
    from pathlib import Path

    import numpy as np

    from inferpool import Runtime

    DIRECTORY = Path(os.environ["STREAM_TEST_DIR"])


    class Counter(Runtime):
        def load(self):
            pass

        def predict(self, payload, outputs):
            return {outputs[0]: payload[:1] * 10}

        async def predict_stream(self, payloads):
            async for payload in payloads:
                count, fail_at, tag, pause, crash = (int(v) for v in payload.ravel()[:5])
                sent = 0
                try:
                    for i in range(count):
                        if i == fail_at:
                            raise ValueError(f"chunk {i} failed")
                        if i == 1 and tag:
                            for _ in range(3000):
                                if (DIRECTORY / f"gate-{tag}").exists():
                                    break
                                await asyncio.sleep(0.01)
                        if i == 1 and pause:
                            await asyncio.sleep(pause)
                        if i == 1 and crash:
                            os._exit(3)
                        # Counted before the yield: a close that lands on this yield
                        # (the server stopped asking) or on the next chunk's gate reads
                        # the same.
                        sent += 1
                        yield {"output-0": np.array([i])}
                finally:
                    if tag:
                        (DIRECTORY / f"closed-{tag}").write_text(str(sent))
"""

DOUBLE = """
    from inferpool import Runtime


    class Double(Runtime):
        def load(self):
            pass

        def predict(self, payload, outputs):
            return {outputs[0]: payload * 2}
"""

# An MLServer custom runtime that streams: one word of its text input per response.
TOKENS = """
    from inferpool.mlserver import MLModel
    from inferpool.mlserver.codecs import StringCodec
    from inferpool.mlserver.types import InferenceResponse


    class Tokens(MLModel):
        async def predict(self, payload):
            text = StringCodec.decode_input(payload.inputs[0])[0]
            return self._response(text.upper())

        async def predict_stream(self, payloads):
            async for payload in payloads:
                text = StringCodec.decode_input(payload.inputs[0])[0]
                for word in text.split():
                    yield self._response(word)

        def _response(self, text):
            output = StringCodec.encode_output("text_output", [text])
            return InferenceResponse(model_name=self.name, outputs=[output])
"""

TAGS = iter(range(1, 10_000))  # a distinct tag per stream: its gate and closed files


def repository(root: Path) -> Path:
    write_custom_model(root / "counter", COUNTER, "Counter")
    write_custom_model(root / "slowpoke", COUNTER, "Counter", module="slowpoke_rt", timeout=1)
    write_custom_model(root / "crasher", COUNTER, "Counter", module="crasher_rt")
    write_custom_model(root / "double", DOUBLE, "Double")
    write_custom_model(root / "tokens", TOKENS, "Tokens", module="tokens_model")
    return root


@pytest.fixture(scope="module", params=SETUPS)
def server(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Server]:
    workers, implementation = request.param
    root = repository(tmp_path_factory.mktemp("streaming"))
    files = tmp_path_factory.mktemp("stream-files")
    flags = ("--workers", str(workers), "--grpc-implementation", implementation)
    with Server(root, *flags, env={"STREAM_TEST_DIR": str(files)}) as running:
        running.wait_ready()
        running.files = files
        running.workers = workers
        running.implementation = implementation
        yield running


@pytest.fixture
def rest(server: Server) -> Server:
    """The REST tests need one gRPC implementation: they run with the builtin one."""
    if server.implementation != "builtin":
        pytest.skip("REST is the same whatever the gRPC implementation")
    return server


def counter_body(count: int, fail_at: int = -1, tag: int = 0, pause: int = 0, crash: int = 0):
    data = [count, fail_at, tag, pause, crash]
    return {"inputs": [{"name": "x", "datatype": "INT64", "shape": [5], "data": data}]}


def events(lines: Iterator[str]) -> Iterator[dict]:
    """The JSON of each ``data:`` event of a Server-Sent Events body."""
    for line in lines:
        if line.startswith("data: "):
            yield orjson.loads(line[len("data: ") :])


def value(event: dict) -> int:
    return event["outputs"][0]["data"][0]


def wait_for(path: Path, timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)
    time.sleep(0.05)  # written, not only created
    return path.read_text()


# -- REST ---------------------------------------------------------------------------------
def test_infer_stream_sends_each_chunk_as_it_comes(rest: Server) -> None:
    tag = next(TAGS)
    url = f"{rest.url}/v2/models/counter/infer_stream"
    with httpx.stream("POST", url, json=counter_body(4, tag=tag), timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        received = events(response.iter_lines())
        first = next(received)
        # The generator waits for the gate after its first chunk: it has not finished.
        assert value(first) == 0
        assert not (rest.files / f"closed-{tag}").exists()
        (rest.files / f"gate-{tag}").touch()
        rest_events = list(received)
    assert [value(e) for e in rest_events] == [1, 2, 3]
    # One id for the whole stream, given to every chunk.
    assert len({e["id"] for e in [first, *rest_events]}) == 1
    assert response.headers["x-request-id"] == first["id"]
    assert wait_for(rest.files / f"closed-{tag}") == "4"


def test_a_model_that_does_not_stream_answers_one_event(rest: Server) -> None:
    body = {"inputs": [{"name": "x", "datatype": "INT64", "shape": [2], "data": [3, 4]}]}
    response = httpx.post(f"{rest.url}/v2/models/double/infer_stream", json=body, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    (only,) = events(iter(response.text.splitlines()))
    assert only["outputs"][0]["data"] == [6, 8]


def test_an_error_mid_stream_ends_it_with_an_error_event(rest: Server) -> None:
    url = f"{rest.url}/v2/models/counter/infer_stream"
    response = httpx.post(url, json=counter_body(5, fail_at=2), timeout=30)
    assert response.status_code == 200
    received = list(events(iter(response.text.splitlines())))
    assert [value(e) for e in received[:2]] == [0, 1]
    assert received[2] == {"error": "model 'counter' raised ValueError: chunk 2 failed"}
    assert len(received) == 3


def test_errors_before_the_first_chunk_are_plain_responses(rest: Server) -> None:
    missing = httpx.post(f"{rest.url}/v2/models/nope/infer_stream", json={}, timeout=30)
    assert missing.status_code == 404
    assert missing.json() == {"error": "model 'nope' not found"}
    bad = httpx.post(f"{rest.url}/v2/models/counter/infer_stream", content=b"{", timeout=30)
    assert bad.status_code == 400
    assert "error" in bad.json()
    first = httpx.post(
        f"{rest.url}/v2/models/counter/infer_stream", json=counter_body(3, fail_at=0), timeout=30
    )
    assert first.status_code == 500
    assert first.json() == {"error": "model 'counter' raised ValueError: chunk 0 failed"}


def test_a_client_that_goes_away_closes_the_generator(rest: Server) -> None:
    tag = next(TAGS)
    url = f"{rest.url}/v2/models/counter/infer_stream"
    # 1000 chunks, the second waiting for a gate that never opens: only the client's
    # departure can end it.
    with httpx.stream("POST", url, json=counter_body(1000, tag=tag), timeout=30) as response:
        assert value(next(events(response.iter_lines()))) == 0
    assert wait_for(rest.files / f"closed-{tag}") == "1"
    # The server goes on serving streams.
    again = httpx.post(url, json=counter_body(2), timeout=30)
    assert [value(e) for e in events(iter(again.text.splitlines()))] == [0, 1]


def test_the_model_timeout_bounds_each_chunk(rest: Server) -> None:
    url = f"{rest.url}/v2/models/slowpoke/infer_stream"
    started = time.monotonic()
    response = httpx.post(url, json=counter_body(3, pause=5), timeout=30)
    assert time.monotonic() - started < 4
    received = list(events(iter(response.text.splitlines())))
    assert value(received[0]) == 0
    assert "produced no chunk within its timeout (1 s)" in received[1]["error"]


def test_generate_stream_and_generate_with_an_mlserver_runtime(rest: Server) -> None:
    body = {"text_input": "the quick fox"}
    url = f"{rest.url}/v2/models/tokens/generate_stream"
    response = httpx.post(url, json=body, timeout=30)
    assert response.status_code == 200
    received = list(events(iter(response.text.splitlines())))
    assert [e["text_output"] for e in received] == ["the", "quick", "fox"]
    assert received[0]["model_name"] == "tokens"
    unary = httpx.post(f"{rest.url}/v2/models/tokens/generate", json=body, timeout=30)
    assert unary.status_code == 200
    assert unary.json()["text_output"] == "THE QUICK FOX"


@needs_pool
def test_a_worker_dying_mid_stream_ends_it_with_an_error(rest: Server) -> None:
    if rest.workers == 0:
        pytest.skip("in-process, the model's crash is the server's")
    url = f"{rest.url}/v2/models/crasher/infer_stream"
    # (A second after its first chunk: chunks not yet written out die with the worker.)
    response = httpx.post(url, json=counter_body(3, pause=1, crash=1), timeout=30)
    assert response.status_code == 200
    received = list(events(iter(response.text.splitlines())))
    assert value(received[0]) == 0
    assert "retry it" in received[1]["error"]  # the 503 of a request its worker held


# -- gRPC ---------------------------------------------------------------------------------
def stream_request(model: str, values: list[int], request_id: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="x", datatype="INT64", shape=[len(values)])
    # Raw contents, as Triton's clients send: the call is answered with Triton's message.
    request.raw_input_contents.append(np.array(values, "<i8").tobytes())
    return request


def answer_value(message: pb.ModelStreamInferResponse) -> int:
    assert not message.error_message, message.error_message
    (output,) = message.infer_response.outputs
    if output.contents.int64_contents:
        return int(output.contents.int64_contents[0])
    return int(np.frombuffer(message.infer_response.raw_output_contents[0], "<i8")[0])


def requests_from(pending: queue.Queue) -> Iterator[pb.ModelInferRequest]:
    while (request := pending.get()) is not None:
        yield request


def test_model_stream_infer_answers_each_request_in_turn(server: Server) -> None:
    tag = next(TAGS)
    pending: queue.Queue = queue.Queue()
    pending.put(stream_request("counter", [3, -1, tag, 0, 0], "streamed"))
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = GRPCInferenceServiceStub(channel).ModelStreamInfer(
            requests_from(pending), timeout=30
        )
        first = next(call)
        assert answer_value(first) == 0
        assert first.infer_response.id == "streamed"
        assert not (server.files / f"closed-{tag}").exists()  # still running
        (server.files / f"gate-{tag}").touch()
        assert [answer_value(next(call)) for _ in range(2)] == [1, 2]
        # The same stream goes on: a model that does not stream, an unknown model, a
        # failure mid-stream; each request's error is a message, the stream lives on.
        pending.put(stream_request("double", [21]))
        pending.put(stream_request("nope", [1]))
        pending.put(stream_request("counter", [3, 1, 0, 0, 0]))
        pending.put(stream_request("counter", [1, -1, 0, 0, 0]))
        pending.put(None)
        rest = list(call)
    assert answer_value(rest[0]) == 42
    assert rest[1].error_message == "model 'nope' not found"
    assert answer_value(rest[2]) == 0
    assert rest[3].error_message == "model 'counter' raised ValueError: chunk 1 failed"
    assert answer_value(rest[4]) == 0
    assert len(rest) == 5
    assert call.code() == grpc.StatusCode.OK


def test_cancelling_a_grpc_stream_closes_the_generator(server: Server) -> None:
    tag = next(TAGS)
    pending: queue.Queue = queue.Queue()
    pending.put(stream_request("counter", [1000, -1, tag, 0, 0]))
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = GRPCInferenceServiceStub(channel).ModelStreamInfer(
            requests_from(pending), timeout=30
        )
        assert answer_value(next(call)) == 0
        call.cancel()
        assert wait_for(server.files / f"closed-{tag}") == "1"
        pending.put(None)


def test_an_unknown_method_fails_at_once(server: Server) -> None:
    pending: queue.Queue = queue.Queue()  # never ends: the client keeps its side open
    with grpc.insecure_channel(server.grpc_address) as channel:
        for method in ("inference.GRPCInferenceService/Nope", "other.Service/Stream"):
            streaming = channel.stream_stream(f"/{method}")
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as caught:
                list(streaming(requests_from(pending), timeout=20))
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert time.monotonic() - started < 1
        unary = channel.unary_unary("/inference.GRPCInferenceService/Nope")
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            unary(b"", timeout=20)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert time.monotonic() - started < 1
    pending.put(None)
