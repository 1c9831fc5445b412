"""The streaming path of a worker (``engine/worker/streaming.py``): chunks as replies
marked MORE, the credit window a slow consumer leaves, cancellation closing the
generator, and the generate extension's wire format."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import orjson
import pytest

from inferpool.engine.ipc import messages, stream_ops
from inferpool.engine.ipc.messages import Kind, RequestHeader
from inferpool.engine.ipc.stream_ops import MORE, STREAM_WINDOW
from inferpool.engine.worker.path import Job
from inferpool.engine.worker.streaming import WorkerStreams, streams
from inferpool.errors import BadRequest
from inferpool.protocol import generate_wire
from inferpool.protocol.types import InferenceResponse, Tensor
from tests.support.runtimes import RowSums, loaded_sums_model


class Chunks(RowSums):
    """Streams the row sums of its payload ``repeat`` times; records what it yielded and
    whether its generator was closed."""

    repeat = 3 * STREAM_WINDOW

    def load(self) -> None:
        super().load()
        self.yielded = 0
        self.closed = False

    #: seconds its generator takes to close (a runtime releasing what it holds)
    closing = 0.0

    async def predict_stream(self, payloads: Any) -> Any:
        async for payload in payloads:
            try:
                for _ in range(self.repeat):
                    yield payload.sum(axis=1)
                    self.yielded += 1
            finally:
                if self.closing:
                    await asyncio.sleep(self.closing)
                self.closed = True


class SlowToClose(Chunks):
    closing = 0.3


def job(request_id: int, rows: list[list[float]]) -> Job:
    body = orjson.dumps(
        {"inputs": [{"name": "x", "datatype": "FP64", "shape": [len(rows), 2], "data": rows}]}
    )
    header = RequestHeader(request_id, 0, Kind.REST_STREAM, None, 0, time.monotonic_ns(), 0)
    return Job(header, body)


def take_until(streams_: WorkerStreams, count: int, timeout: float = 5) -> list:
    taken: list = []
    deadline = time.monotonic() + timeout
    while len(taken) < count and time.monotonic() < deadline:
        taken += streams_.take()
        time.sleep(0.005)
    return taken


def test_a_runtime_streams_when_it_has_predict_stream() -> None:
    assert streams(loaded_sums_model(Chunks).runtime)
    assert not streams(loaded_sums_model(RowSums).runtime)


def test_a_stream_sends_no_more_than_its_window_ahead_of_its_consumer() -> None:
    model = loaded_sums_model(Chunks)
    runner = WorkerStreams()
    runner.start(model, job(7, [[1.0, 2.0]]))
    first = take_until(runner, STREAM_WINDOW)
    time.sleep(0.2)  # room to run on, were the window not enforced
    assert len(first) + len(runner.take()) == STREAM_WINDOW
    assert model.runtime.yielded <= STREAM_WINDOW + 1  # the generator waits too
    assert all(reply.flags & MORE and reply.status == 200 for _, reply in first)
    assert orjson.loads(first[0][1].body)["outputs"][0]["data"] == [3.0]
    runner.credit(7, 2 * STREAM_WINDOW)
    rest = take_until(runner, 2 * STREAM_WINDOW + 1)
    assert len(rest) == 2 * STREAM_WINDOW + 1  # every chunk, then the last reply
    last = rest[-1][1]
    assert last.status == 200 and last.body == b"" and not last.flags & MORE
    assert last.times is not None and last.times.compute_infer > 0
    assert len(runner) == 0
    assert model.runtime.closed


@pytest.mark.parametrize("runtime", [Chunks, SlowToClose])
def test_cancelling_a_stream_closes_its_generator(runtime: type[Chunks]) -> None:
    # Closed before the last reply is sent, however long the runtime takes to close.
    model = loaded_sums_model(runtime)
    runner = WorkerStreams()
    runner.start(model, job(3, [[1.0, 1.0]]))
    assert len(take_until(runner, STREAM_WINDOW)) == STREAM_WINDOW  # then it waits
    runner.cancel(3)
    (last,) = take_until(runner, 1)
    assert last[1].status == 499 and not last[1].flags & MORE
    assert model.runtime.closed
    assert len(runner) == 0


def test_a_bad_request_is_the_streams_one_reply() -> None:
    runner = WorkerStreams()
    runner.start(loaded_sums_model(Chunks), job(4, [[1.0, 2.0, 3.0]]))
    (last,) = take_until(runner, 1)
    assert last[1].status == 400 and not last[1].flags & MORE
    assert len(runner) == 0


def test_credit_and_cancel_for_a_stream_no_longer_running_are_ignored() -> None:
    runner = WorkerStreams()
    runner.credit(1, 5)  # before any stream: no loop yet
    runner.cancel(1)
    runner.start(loaded_sums_model(RowSums), job(2, [[1.0, 2.0]]))  # no predict_stream
    (last,) = take_until(runner, 1)
    assert last[1].status == 500
    runner.credit(2, 1)
    runner.cancel(2)
    assert stream_ops.Credit(request_id=2, chunks=1).op == messages.Op.CREDIT


# -- the generate extension's wire format --------------------------------------------------
def test_generate_inputs_are_the_requests_keys() -> None:
    request = generate_wire.decode(
        b'{"text_input": "hi", "n": 3, "scores": [0.5, 1.5], "ok": true, "id": "r1",'
        b' "parameters": {"max_tokens": 8}}'
    )
    tensors = {tensor.name: tensor for tensor in request.inputs}
    assert tensors["text_input"].datatype == "BYTES" and tensors["text_input"].shape == (1,)
    assert tensors["n"].datatype == "INT64" and tensors["n"].data.tolist() == [3]
    assert tensors["scores"].datatype == "FP64" and tensors["scores"].shape == (2,)
    assert tensors["ok"].datatype == "BOOL"
    assert request.id == "r1" and request.parameters == {"max_tokens": 8}


@pytest.mark.parametrize(
    "body", [b'{"id": "x"}', b'{"text_input": []}', b'{"text_input": {"a": 1}}', b"[1]"]
)
def test_a_generate_request_without_usable_inputs_is_a_400(body: bytes) -> None:
    with pytest.raises(BadRequest):
        generate_wire.decode(body)


def test_generate_outputs_are_the_responses_keys() -> None:
    text = np.array([b"hello"], dtype=object)
    response = InferenceResponse(
        "m",
        [
            Tensor("text_output", "BYTES", (1,), text, {"content_type": "str"}),
            Tensor("scores", "FP64", (2,), np.array([0.25, 0.75])),
        ],
        model_version="2",
        id="r1",
    )
    body, json_length = generate_wire.encode(response, generate_wire.decode(b'{"x": 1}'))
    assert json_length is None
    assert orjson.loads(body) == {
        "model_name": "m",
        "model_version": "2",
        "id": "r1",
        "text_output": "hello",
        "scores": [0.25, 0.75],
    }


def test_a_v2_request_on_a_generate_endpoint_is_answered_in_v2() -> None:
    # MLServer's generate endpoints are aliases of infer: its clients send V2 bodies.
    request = generate_wire.decode(
        b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [2.5]}]}'
    )
    assert request.inputs[0].name == "x" and request.inputs[0].data.tolist() == [2.5]
    response = InferenceResponse("m", [Tensor("y", "FP64", (1,), np.array([5.0]))], id="i")
    body, _ = generate_wire.encode(response, request)
    assert orjson.loads(body)["outputs"][0]["data"] == [5.0]
