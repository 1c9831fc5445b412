"""A stream fed its client's further requests (``Kind.GRPC_STREAM_IN``): in a worker
(``WorkerStreams.feed``, ``TOOK`` replies), with ``workers=0`` (``stream_feed``), the input
window that holds a fast client back, and the end of input ending the runtime's loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from inferpool.engine.ipc.messages import Kind, RequestHeader
from inferpool.engine.ipc.stream_ops import INPUT_WINDOW, MORE, TOOK
from inferpool.engine.stream_feed import LocalFeed, feeding, local_replies
from inferpool.engine.worker.path import Job
from inferpool.engine.worker.stream_input import StreamInput
from inferpool.engine.worker.streaming import WorkerStreams, stream_replies
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support.runtimes import RowSums, loaded_sums_model


class Running(RowSums):
    """A running total over every payload of one predict_stream call, one chunk each;
    ``pause``: seconds it waits before taking the next payload."""

    pause = 0.0

    def load(self) -> None:
        super().load()
        self.taken = 0
        self.closed = False

    async def predict_stream(self, payloads: Any) -> Any:
        total = 0.0
        try:
            async for payload in payloads:
                self.taken += 1
                total += float(payload.sum())
                yield np.array([total, self.taken])
                await asyncio.sleep(self.pause)
        finally:
            self.closed = True


def body(*values: float) -> bytes:
    request = pb.ModelInferRequest(model_name="sums")
    tensor = request.inputs.add(name="x", datatype="FP64", shape=[len(values) // 2, 2])
    tensor.contents.fp64_contents.extend(values)
    return request.SerializeToString()


def job(request_id: int, data: bytes) -> Job:
    header = RequestHeader(request_id, 0, Kind.GRPC_STREAM_IN, None, 0, time.monotonic_ns(), 0)
    return Job(header, data)


def chunk(reply: Any) -> list[float]:
    (output,) = pb.ModelInferResponse.FromString(reply.body).outputs
    return list(output.contents.fp64_contents)  # typed in, typed out


def take_until(streams: WorkerStreams, count: int, timeout: float = 5) -> list:
    taken: list = []
    deadline = time.monotonic() + timeout
    while len(taken) < count and time.monotonic() < deadline:
        taken += [reply for _, reply in streams.take()]
        time.sleep(0.005)
    return taken


def test_a_worker_stream_takes_fed_requests_in_the_same_call() -> None:
    model = loaded_sums_model(Running)
    runner = WorkerStreams()
    runner.start(model, job(3, body(1.0, 2.0)))
    (first,) = take_until(runner, 1)
    assert first.flags & MORE and chunk(first) == [3.0, 1.0]  # before anything is fed
    runner.feed(3, body(10.0, 20.0))
    took, second = take_until(runner, 2)
    assert took.flags == MORE | TOOK and took.body == b""  # the window's room, no chunk
    assert chunk(second) == [33.0, 2.0]
    runner.feed(3, None)  # the end of input: the runtime's loop ends, so does the stream
    (last,) = take_until(runner, 1)
    assert last.status == 200 and not last.flags & MORE and last.body == b""
    assert model.runtime.closed and len(runner) == 0


def test_a_fed_request_that_does_not_decode_ends_the_stream_with_400() -> None:
    model = loaded_sums_model(Running)
    runner = WorkerStreams()
    runner.start(model, job(4, body(1.0, 2.0)))
    take_until(runner, 1)
    runner.feed(4, b"\xff\xff not a message")
    replies = take_until(runner, 2)
    assert replies[0].flags & TOOK
    assert replies[-1].status == 400 and not replies[-1].flags & MORE
    assert model.runtime.closed


def test_cancelling_a_stream_that_waits_for_input_closes_its_generator() -> None:
    model = loaded_sums_model(Running)
    runner = WorkerStreams()
    runner.start(model, job(5, body(1.0, 2.0)))
    take_until(runner, 1)
    runner.cancel(5)  # the runtime awaits its next payload
    (last,) = take_until(runner, 1)
    assert last.status == 499 and model.runtime.closed and len(runner) == 0
    runner.feed(5, body(1.0, 1.0))  # fed after its end: dropped, nothing raises
    time.sleep(0.05)
    assert runner.take() == []


def test_a_stream_input_refuses_more_than_its_window() -> None:
    stream_input = StreamInput()
    for _ in range(INPUT_WINDOW):
        stream_input.put(b"x")
    with pytest.raises(RuntimeError, match="ahead of the runtime"):
        stream_input.put(b"x")


def test_a_fast_client_is_read_no_further_than_the_window() -> None:
    async def scenario() -> tuple[int, list[list[float]]]:
        model = loaded_sums_model(Running)
        model.runtime.pause = 0.3  # slow to take each payload
        read = 0

        async def client() -> AsyncIterator[bytes]:
            nonlocal read
            for n in range(20):
                read += 1
                yield body(float(n), 0.0)

        start = job(0, body(0.5, 0.5))
        replies = local_replies(lambda more: stream_replies(model, start, more), client())
        chunks = [chunk(await anext(replies))]
        await asyncio.sleep(0.2)  # the runtime took one payload; the client could race on
        seen = read
        async for reply in replies:
            if reply.flags & MORE:
                chunks.append(chunk(reply))
        return seen, chunks

    seen, chunks = asyncio.run(scenario())
    # The window's requests, the one the feeder holds, and the runtime's next: no more.
    assert seen <= INPUT_WINDOW + 2
    assert [c[1] for c in chunks] == [float(n) for n in range(1, 22)]
    assert chunks[-1][0] == 1.0 + sum(range(20))


def test_an_input_error_ends_a_local_stream_with_it() -> None:
    from inferpool.errors import BadRequest

    async def scenario() -> list[Any]:
        model = loaded_sums_model(Running)

        async def client() -> AsyncIterator[bytes]:
            yield body(1.0, 1.0)
            await asyncio.sleep(0.05)
            raise BadRequest("request 3 names another model")

        start = job(0, body(1.0, 2.0))
        replies = local_replies(lambda more: stream_replies(model, start, more), client())
        return [reply async for reply in replies]

    replies = asyncio.run(scenario())
    assert [chunk(reply)[1] for reply in replies[:2]] == [1.0, 2.0]
    assert replies[-1].status == 400 and b"names another model" in replies[-1].body


def test_feeding_nothing_is_a_no_op() -> None:
    async def scenario() -> None:
        feed = LocalFeed()
        async with feeding(None, feed):
            pass
        assert not feed.failed.done()

    asyncio.run(scenario())


def test_the_calls_own_failure_keeps_its_grpc_status() -> None:
    from inferpool.errors import grpc_code_for
    from inferpool.frontends.grpc.h2 import CallError
    from inferpool.frontends.grpc.stream_input import _same_model

    async def flood() -> AsyncIterator[bytes]:
        yield body(1.0, 1.0)
        raise CallError("RESOURCE_EXHAUSTED", "over 100 bytes of request messages wait")

    async def scenario() -> tuple[list[bytes], Exception]:
        taken: list[bytes] = []
        try:
            async for request in _same_model(flood(), "sums", None):
                taken.append(request)
        except Exception as exc:
            return taken, exc
        raise AssertionError("no error")

    taken, error = asyncio.run(scenario())
    assert len(taken) == 1
    assert grpc_code_for(error.status) == "RESOURCE_EXHAUSTED"  # type: ignore[attr-defined]
    assert "wait" in str(error)


def test_a_later_request_naming_another_model_is_refused() -> None:
    from inferpool.errors import BadRequest
    from inferpool.frontends.grpc.stream_input import _same_model

    def named(model: str, version: str = "") -> bytes:
        return pb.ModelInferRequest(model_name=model, model_version=version).SerializeToString()

    async def scenario(requests: list[bytes], version: str | None) -> list[bytes]:
        async def source() -> AsyncIterator[bytes]:
            for request in requests:
                yield request

        return [request async for request in _same_model(source(), "sums", version)]

    same = [named("sums"), named(""), named("sums", "2")]
    assert asyncio.run(scenario(same, "2")) == same
    with pytest.raises(BadRequest, match="request 3 of the stream names model 'other'"):
        asyncio.run(scenario([named("sums"), named("other")], None))
    with pytest.raises(BadRequest, match=r"names model 'sums' version 1, .* runs model 'sums'"):
        asyncio.run(scenario([named("sums", "1")], "2"))
