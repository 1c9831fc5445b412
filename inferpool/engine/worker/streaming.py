"""Streamed requests: a runtime's ``predict_stream`` answering one request with several
replies, in a worker (``WorkerStreams``) and with ``workers=0`` (``stream_replies``).

``stream_replies`` is the path of one streamed request: decode it in its wire format,
hand its payload to ``runtime.predict_stream`` (an async generator over an async
iterator of payloads, here of the one request), encode each chunk it yields as a response
of that format (a reply with ``MORE`` set), then end with an empty 200 carrying the
stream's stage times, or with the error it raised (the chunks already sent stand). The
generator is closed (``aclose``) however the stream ends: finished, failed, past its
deadline, or cancelled because its client went away.

``WorkerStreams`` runs those generators in a worker on an event loop of their own, in a
thread started at the first stream, so that a generator awaiting (a token at a time)
never holds the worker's poll loop, nor the other models it serves. The worker's loop
stays the only producer of its response ring: chunks come to it through a queue and an
eventfd it polls (``bell``), and it writes them out (``take``). A stream sends at most
``STREAM_WINDOW`` chunks its frontend has not taken yet (``stream_ops.Credit`` returns them),
so a slow consumer bounds what a worker and the frontend hold for it. A stream that takes
its client's whole stream (``Kind.GRPC_STREAM_IN``) gets the requests fed after its first
(``feed``, ``end_input``) through a ``stream_input.StreamInput``, and tells its frontend
of each one its runtime takes with a ``TOOK`` reply (the input's window).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

from inferpool.engine.ipc.messages import Kind, Reply, StageTimes
from inferpool.engine.ipc.stream_ops import MORE, STREAM_WINDOW, TOOK
from inferpool.engine.worker import inference
from inferpool.engine.worker.model import LoadedModel
from inferpool.engine.worker.path import Job
from inferpool.engine.worker.stream_input import StreamInput
from inferpool.engine.worker.wire_formats import wire_format
from inferpool.errors import ClientGone, DeadlineExceeded
from inferpool.protocol.rest_json import new_request_id


def streams(runtime: Any) -> bool:
    """The runtime answers streamed requests with ``predict_stream`` (others answer them
    with one reply, from ``predict``)."""
    if not callable(getattr(runtime, "predict_stream", None)):
        return False
    return bool(getattr(runtime, "streams", True))


async def _payloads(
    model: LoadedModel, first: Any, request_id: str, more: AsyncIterator[bytes] | None, kind: int
) -> AsyncIterator[Any]:
    """The runtime's payloads: the first request's, then each fed one's (``more``) as it
    comes, under the first one's id (MLServer's rule: one id for the whole stream). A fed
    request that does not decode raises its 400 into the runtime."""
    yield first
    if more is None:
        return
    wire = wire_format(kind)
    async for body in more:
        request = wire.decode(body, None)
        request.id = request_id
        payload, _ = inference.prepare(model, request)
        yield payload


async def stream_replies(
    model: LoadedModel, job: Job, more: AsyncIterator[bytes] | None = None
) -> AsyncGenerator[Reply, None]:
    """The replies of one streamed request: a chunk each (``MORE``), then the last one
    (an empty 200 with the stream's times, or the error). Raises only CancelledError.
    ``more``: the bodies of the requests its client sends after it (``stream_input``), for
    a stream that takes its client's whole stream."""
    started = time.monotonic_ns()
    times = StageTimes(started - job.enqueued_ns)
    generator: Any = None
    payloads: Any = None
    try:
        wire = wire_format(job.kind)
        request = wire.decode(job.body, job.json_length)
        if not request.id:  # one id for every chunk of the stream
            request.id = new_request_id()
        payload, outputs = inference.prepare(model, request)
        times.compute_input = time.monotonic_ns() - started
        remaining = None
        if job.deadline_ns:
            remaining = max(0.0, (job.deadline_ns - time.monotonic_ns()) / 1e9)
        payloads = _payloads(model, payload, request.id, more, job.kind)
        generator = model.runtime.predict_stream(payloads)  # type: ignore[attr-defined]
        async with asyncio.timeout(remaining):
            while True:
                computing = time.monotonic_ns()
                try:
                    result = await generator.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    raise inference.model_failure(model, exc, request) from None
                encoding = time.monotonic_ns()
                times.compute_infer += encoding - computing
                if not isinstance(result, Mapping):
                    result = {outputs[0]: result}
                response = inference.respond(model, request, result)
                body, json_length = wire.encode(response, request)
                times.compute_output += time.monotonic_ns() - encoding
                yield Reply(200, body, json_length, flags=MORE)
    except TimeoutError:
        yield Reply.from_error(DeadlineExceeded("the request's deadline passed while streaming"))
        return
    except Exception as exc:
        yield Reply.from_error(exc, model.name)
        return
    finally:
        for opened in (generator, payloads):
            if opened is not None:
                with contextlib.suppress(Exception):
                    await opened.aclose()
    yield Reply(200, b"", None, times, 1, 1)


class _Stream:
    """One stream running in a worker: its task, its credit (chunks it may send) and, if
    it takes its client's whole stream, its input."""

    __slots__ = ("credit", "input", "task")

    def __init__(self) -> None:
        self.credit = asyncio.Semaphore(STREAM_WINDOW)
        self.task: asyncio.Task[None] | None = None
        self.input: StreamInput | None = None


class WorkerStreams:
    """A worker's streams, on an event loop in a thread of their own (the module's text)."""

    def __init__(self) -> None:
        self.bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._out: queue.SimpleQueue[tuple[Job, Reply]] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[int, _Stream] = {}  # by request id; touched on the loop only
        self._open = 0  # streams started and not ended, as the worker's loop counts them

    def start(self, model: LoadedModel, job: Job) -> None:
        """Run a streamed request; its replies come out of ``take``."""
        self._open += 1
        self._current().call_soon_threadsafe(self._begin, model, job)

    def credit(self, request_id: int, chunks: int) -> None:
        """Its consumer took ``chunks``: the stream may send as many more."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._release, request_id, chunks)

    def feed(self, request_id: int, body: bytes | None) -> None:
        """One more request of the stream's client (None: the end of its input); dropped
        if the stream has ended (its runtime stopped before taking every request)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._feed, request_id, body)

    def cancel(self, request_id: int) -> None:
        """Its client went away: its generator is closed, its last reply says so."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._cancel, request_id)

    def take(self) -> list[tuple[Job, Reply]]:
        """The replies ready now, in order (the worker's loop writes them out)."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.bell)
        ready = []
        with contextlib.suppress(queue.Empty):
            while True:
                job, reply = self._out.get_nowait()
                ready.append((job, reply))
                if not reply.flags & MORE:
                    self._open -= 1
        return ready

    def __len__(self) -> int:
        """Streams not ended yet (their last reply not taken)."""
        return self._open

    # -- on the streams' loop --------------------------------------------------------------
    def _current(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="inferpool-streams")
            thread.daemon = True
            thread.start()
            self._loop = loop
        return self._loop

    def _begin(self, model: LoadedModel, job: Job) -> None:
        stream = self._streams[job.request_id] = _Stream()
        if job.kind == Kind.GRPC_STREAM_IN:
            stream.input = StreamInput(lambda: self._emit(job, Reply(200, b"", flags=MORE | TOOK)))
        stream.task = asyncio.get_running_loop().create_task(self._run(model, job, stream))

    async def _run(self, model: LoadedModel, job: Job, stream: _Stream) -> None:
        more = None if stream.input is None else stream.input.bodies()
        replies = stream_replies(model, job, more)
        try:
            async for reply in replies:
                if reply.flags & MORE:
                    await stream.credit.acquire()
                self._emit(job, reply)
        except asyncio.CancelledError:
            # The runtime's generator is closed before the last reply says so (left to the
            # loop's finalizer, it closed after the reply: a consumer could see it open).
            with contextlib.suppress(Exception):
                await replies.aclose()
            self._emit(job, Reply.from_error(ClientGone("the client went away")))
        finally:
            self._streams.pop(job.request_id, None)

    def _emit(self, job: Job, reply: Reply) -> None:
        self._out.put((job, reply))
        os.eventfd_write(self.bell, 1)

    def _release(self, request_id: int, chunks: int) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            for _ in range(chunks):
                stream.credit.release()

    def _feed(self, request_id: int, body: bytes | None) -> None:
        stream = self._streams.get(request_id)
        if stream is None or stream.input is None:
            return
        if body is None:
            stream.input.end()
        else:
            stream.input.put(body)

    def _cancel(self, request_id: int) -> None:
        stream = self._streams.get(request_id)
        if stream is not None and stream.task is not None:
            stream.task.cancel()
