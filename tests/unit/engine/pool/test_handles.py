"""The frontend's side of one worker (``engine/pool/handles.py``), with this test playing
the worker on the other end of its rings, doorbell and control channel (no process): what
completes a request, what each control message changes, and what closing fails."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import pytest

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.channel import Channel
from inferpool.engine.ipc.messages import Kind, Op, Reply, reply_header, request_header
from inferpool.engine.ipc.ring import Ring
from inferpool.engine.pool.handles import SLOT_SIZE, WorkerHandle
from inferpool.errors import WorkerLost

SLOTS = 4


class TheWorker:
    """The worker's ends of a handle's rings, reply doorbell and channel."""

    def __init__(self, handle: WorkerHandle) -> None:
        request_fd, reply_fd = handle.fds
        self.requests = Ring(request_fd, SLOTS, SLOT_SIZE)
        self.replies = Ring(reply_fd, SLOTS, SLOT_SIZE)
        self.bell = handle.reply_bell
        self.channel = Channel(handle.child_socket)

    def answer(self, request_id: int, reply: Reply) -> None:
        assert self.replies.push(reply_header(request_id, reply), reply.body)
        os.eventfd_write(self.bell, 1)

    def tell(self, message: messages.Control) -> None:
        self.channel.send_control(message)

    def received(self) -> tuple[int, bytes]:
        op, payload, _ = self.channel.receive()
        return op, payload


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def scenario(test: Callable[[WorkerHandle, TheWorker, list[WorkerHandle]], Any]) -> None:
    """Run ``test(handle, worker, died)`` with the handle watched by this loop."""

    async def main() -> None:
        handle = WorkerHandle(slot=3, slots=SLOTS)
        worker = TheWorker(handle)
        died: list[WorkerHandle] = []
        handle.watch(died.append)
        try:
            await test(handle, worker, died)
        finally:
            handle.close("the test ended")

    asyncio.run(main())


def test_a_reply_in_the_ring_completes_its_request_once() -> None:
    async def test(handle: WorkerHandle, worker: TheWorker, died: list[WorkerHandle]) -> None:
        loop = asyncio.get_running_loop()
        waiting, gone = loop.create_future(), loop.create_future()
        handle.inflight[1], handle.inflight[2] = waiting, gone
        gone.cancel()  # its caller went away
        worker.answer(1, Reply(200, b'{"ok":1}', json_length=8, rows=2, execution=2))
        worker.answer(2, Reply(200, b"late"))
        worker.answer(9, Reply(200, b"unknown id"))
        reply = await asyncio.wait_for(waiting, 10)
        answered = (reply.status, reply.body, reply.json_length, reply.rows)
        assert answered == (200, b'{"ok":1}', 8, 2)
        await until(lambda: not handle.inflight)
        assert handle.alive and died == []

    scenario(test)


def test_control_messages_update_what_the_pool_tracks() -> None:
    async def test(handle: WorkerHandle, worker: TheWorker, died: list[WorkerHandle]) -> None:
        worker.tell(messages.Hello(pid=4242, epoch=3))
        await asyncio.wait_for(handle.hello, 10)
        assert (handle.pid, handle.epoch) == (4242, 3)
        assert handle.describe() == "worker 3 (pid 4242)"

        loaded = asyncio.get_running_loop().create_future()
        handle.loads[5] = loaded
        worker.tell(messages.Loading(name="m", version=None))
        await until(lambda: handle.loading is not None)
        since = handle.loading_since
        assert since > 0 and handle.loading.name == "m"  # type: ignore[union-attr]
        worker.tell(messages.Loading(name="m", version=None, file="/m/x.txt", library="L"))
        await until(lambda: handle.loading.file == "/m/x.txt")  # type: ignore[union-attr]
        assert handle.loading_since == since  # a file of the same load: the clock runs on
        worker.tell(messages.Loaded(index=5, ok=True, size=7))
        assert (await asyncio.wait_for(loaded, 10)).size == 7
        assert handle.loading is None and handle.loads == {}

        worker.tell(messages.Recycle(reason="memory_limit", detail="over 1 GiB"))
        await until(lambda: handle.recycle is not None)
        assert handle.recycle == messages.Recycle(reason="memory_limit", detail="over 1 GiB")

    scenario(test)


def test_a_reply_too_big_for_a_slot_comes_over_the_channel() -> None:
    async def test(handle: WorkerHandle, worker: TheWorker, died: list[WorkerHandle]) -> None:
        future = asyncio.get_running_loop().create_future()
        handle.inflight[8] = future
        body = b"x" * 100
        reply = Reply(200, body, rows=1)
        worker.channel.send(Op.REPLY, reply_header(8, reply) + body)
        answered = await asyncio.wait_for(future, 10)
        assert answered.body == body and answered.rows == 1

    scenario(test)


def test_what_the_frontend_posts_reaches_the_worker_and_big_requests_are_counted() -> None:
    async def test(handle: WorkerHandle, worker: TheWorker, died: list[WorkerHandle]) -> None:
        handle.post_control(messages.Cancel(request_id=12))
        op, payload = await asyncio.to_thread(worker.received)
        assert messages.decode(op, payload) == messages.Cancel(request_id=12)
        assert handle.requests_sent == 0
        header = request_header(13, 1, Kind.REST, None, None, 3)
        handle.post(Op.REQUEST, header, b"big")
        op, payload = await asyncio.to_thread(worker.received)
        assert op == Op.REQUEST and payload == header + b"big"
        assert handle.requests.push(request_header(14, 1, Kind.REST, None, None, 1), b"s")
        assert handle.requests_sent == 2  # one over the channel, one in the ring

    scenario(test)


def test_the_worker_s_eof_reports_it_dead() -> None:
    async def test(handle: WorkerHandle, worker: TheWorker, died: list[WorkerHandle]) -> None:
        worker.channel.close()
        await until(lambda: bool(died))  # (the pool's callback closes it: no more calls)
        assert died[0] is handle

    scenario(test)


def test_closing_fails_what_it_held_with_the_reason_and_twice_is_harmless() -> None:
    async def main() -> None:
        handle = WorkerHandle(slot=1, slots=SLOTS)
        handle.watch(lambda _: None)
        loop = asyncio.get_running_loop()
        request, load = loop.create_future(), loop.create_future()
        handle.inflight[1], handle.loads[2] = request, load
        handle.retiring = True
        handle.close("worker 1 crashed (SIGSEGV)")
        handle.close("again")
        assert not handle.alive and handle.closed and handle.exited.done()
        reply = request.result()
        assert reply.status == 503
        assert reply.body == b"worker 1 crashed (SIGSEGV) while running the request; retry it"
        with pytest.raises(WorkerLost, match="worker 1 crashed"):
            load.result()
        with pytest.raises(WorkerLost):
            handle.hello.result()
        assert handle.inflight == {} and handle.loads == {}
        assert handle.describe() == "retiring worker 1 (pid 0)"
        with pytest.raises(OSError):
            handle.post_control(messages.Cancel(request_id=1))

    asyncio.run(main())
