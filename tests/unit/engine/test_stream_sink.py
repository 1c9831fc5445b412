"""The frontend's end of a streamed request (``engine/stream_sink.py``), over a fake worker:
where it sits in the in-flight map, the credits it returns, the input window it keeps, and
what ``close`` and ``fail`` send."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferpool.engine.ipc import messages, stream_ops
from inferpool.engine.ipc.messages import Reply
from inferpool.engine.ipc.stream_ops import INPUT_WINDOW, MORE, STREAM_WINDOW, TOOK
from inferpool.engine.stream_sink import StreamSink


class FakeWorker:
    """What a sink uses of a ``WorkerHandle``: its in-flight map and its control channel."""

    def __init__(self) -> None:
        self.inflight: dict[int, Any] = {}
        self.alive = True
        self.closed = False
        self.gone = False  # posting raises OSError (it died)
        self.sent: list[messages.Control] = []

    def post_control(self, message: messages.Control) -> None:
        if self.gone:
            raise OSError("channel closed")
        self.sent.append(message)


def sink() -> tuple[StreamSink, FakeWorker]:
    worker = FakeWorker()
    stream = StreamSink(worker, 7)  # type: ignore[arg-type]
    worker.inflight[7] = stream
    return stream, worker


def deliver(stream: StreamSink, worker: FakeWorker, reply: Reply) -> None:
    """As ``drain_replies`` does: the entry is popped, then given the reply."""
    worker.inflight.pop(stream.request_id)
    stream.set_result(reply)


def chunk(n: int) -> Reply:
    return Reply(200, f"chunk {n}".encode(), flags=MORE)


def test_chunks_keep_it_in_flight_and_the_last_reply_ends_it() -> None:
    async def main() -> None:
        stream, worker = sink()
        deliver(stream, worker, chunk(0))
        assert worker.inflight[7] is stream and not stream.ended  # more to come
        deliver(stream, worker, Reply(200, b"last"))
        assert 7 not in worker.inflight and stream.ended
        assert (await stream.next()).body == b"chunk 0"
        last = await stream.next()
        assert last.body == b"last" and not last.flags & MORE

    asyncio.run(main())


def test_a_chunk_from_a_closed_worker_ends_the_stream() -> None:
    stream, worker = sink()
    worker.closed = True
    deliver(stream, worker, chunk(0))
    assert stream.ended and 7 not in worker.inflight


def test_next_waits_for_the_reply_that_comes_later() -> None:
    async def main() -> None:
        stream, worker = sink()
        waiting = asyncio.ensure_future(stream.next())
        await asyncio.sleep(0)
        assert not waiting.done()
        deliver(stream, worker, Reply(200, b"late"))
        assert (await asyncio.wait_for(waiting, 5)).body == b"late"

    asyncio.run(main())


def test_every_half_window_taken_is_returned_as_one_credit() -> None:
    async def main() -> None:
        stream, worker = sink()
        half = STREAM_WINDOW // 2
        for n in range(half * 2 + 1):
            deliver(stream, worker, chunk(n))
        for _ in range(half - 1):
            await stream.next()
        assert worker.sent == []  # not yet half a window
        await stream.next()
        assert worker.sent == [stream_ops.Credit(request_id=7, chunks=half)]
        for _ in range(half + 1):
            await stream.next()
        credits = [m for m in worker.sent if isinstance(m, stream_ops.Credit)]
        assert len(credits) == 2 and stream.taken == 1

    asyncio.run(main())


def test_feeding_waits_for_room_that_took_replies_make() -> None:
    async def main() -> None:
        stream, worker = sink()
        for n in range(INPUT_WINDOW):
            await stream.feed(b"%d" % n)
        blocked = asyncio.ensure_future(stream.feed(b"more"))
        await asyncio.sleep(0.01)
        assert not blocked.done()  # the runtime has taken none of the window yet
        deliver(stream, worker, Reply(200, b"", flags=MORE | TOOK))
        await asyncio.wait_for(blocked, 5)
        feeds = [m.body for m in worker.sent if isinstance(m, stream_ops.Feed)]
        assert feeds == [b"%d" % n for n in range(INPUT_WINDOW)] + [b"more"]
        assert not stream.replies  # a TOOK reply is no chunk for the consumer
        assert worker.inflight[7] is stream

    asyncio.run(main())


def test_no_input_is_sent_to_a_stream_that_ended() -> None:
    async def main() -> None:
        stream, worker = sink()
        deliver(stream, worker, Reply(200, b"done"))
        await stream.feed(b"late")
        stream.end_input()
        assert worker.sent == []

    asyncio.run(main())


def test_end_input_tells_the_worker() -> None:
    stream, worker = sink()
    stream.end_input()
    assert worker.sent == [stream_ops.EndInput(request_id=7)]


def test_close_before_the_end_cancels_once_and_drops_what_comes() -> None:
    stream, worker = sink()
    stream.close()
    stream.close()
    assert worker.sent == [messages.Cancel(request_id=7)]
    assert 7 not in worker.inflight and stream.done()


def test_close_after_the_last_reply_sends_nothing() -> None:
    stream, worker = sink()
    deliver(stream, worker, Reply(200, b"last"))
    stream.close()
    assert worker.sent == []


def test_fail_cancels_in_the_worker_and_gives_the_consumer_the_error() -> None:
    async def main() -> None:
        stream, worker = sink()
        stream.fail(Reply(400, b"names another model"))
        assert worker.sent == [messages.Cancel(request_id=7)]
        assert stream.ended and not stream.closed
        error = await stream.next()
        assert error.status == 400 and error.body == b"names another model"
        stream.fail(Reply(400, b"twice"))  # ended: nothing more
        assert not stream.replies and len(worker.sent) == 1

    asyncio.run(main())


@pytest.mark.parametrize("dead", ["not alive", "channel gone"])
def test_a_dead_worker_is_sent_nothing_and_raises_nothing(dead: str) -> None:
    stream, worker = sink()
    if dead == "not alive":
        worker.alive = False
    else:
        worker.gone = True
    stream.end_input()
    stream.close()
    assert worker.sent == [] and stream.closed
