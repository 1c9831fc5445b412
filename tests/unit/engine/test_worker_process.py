"""The worker process loop (engine/worker/process.py), run as a real child process on
real rings, doorbells and a control channel, driven from this side as the frontend
drives it: hello, load, requests through the ring, ping, unload, a failed load, stop, and
the frontend's death."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator

import orjson
import pytest

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.channel import Channel, socket_pair
from inferpool.engine.ipc.messages import Kind, Op, ReplyHeader
from inferpool.engine.ipc.ring import Ring, create_ring_fd
from inferpool.settings import ModelSettings

SLOTS, SLOT_SIZE = 8, 64 * 1024
WAIT = 60.0  # seconds: generous, the machine may be loaded

CHILD = """
import sys
from inferpool.engine.ipc import messages
from inferpool.engine.worker import process
fds = [int(fd) for fd in sys.argv[1:6]]
slots, slot_size = int(sys.argv[6]), int(sys.argv[7])
spec = messages.Spawn(worker=5, threads=1, slots=slots, slot_size=slot_size, limits={})
process.main(spec, fds, 0)
"""

SUMS = ModelSettings(
    name="sums",
    implementation="tests.support.runtimes.RowSums",
    inputs=[{"name": "x", "datatype": "FP64", "shape": [-1, 2]}],
    outputs=[{"name": "sum", "datatype": "FP64", "shape": [-1]}],
)


class Frontend:
    """This side of one worker: its rings, doorbells and channel."""

    def __init__(self) -> None:
        request_fd, reply_fd = create_ring_fd(SLOTS, SLOT_SIZE), create_ring_fd(SLOTS, SLOT_SIZE)
        self.requests = Ring(request_fd, SLOTS, SLOT_SIZE)
        self.replies = Ring(reply_fd, SLOTS, SLOT_SIZE)
        self.request_bell = os.eventfd(0, os.EFD_NONBLOCK)
        self.reply_bell = os.eventfd(0, os.EFD_NONBLOCK)
        ours, theirs = socket_pair()
        self.channel = Channel(ours)
        fds = [request_fd, reply_fd, self.request_bell, self.reply_bell, theirs.fileno()]
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, *map(str, fds), str(SLOTS), str(SLOT_SIZE)],
            pass_fds=fds,
        )
        theirs.close()
        os.close(request_fd)
        os.close(reply_fd)
        self.next_id = 0

    def control(self, timeout: float = WAIT) -> messages.Control:
        """The next control message but log records and custom metrics."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.channel.fileno()], [], [], 0.1)
            if not ready:
                continue
            op, payload, fds = self.channel.receive()
            for fd in fds:
                os.close(fd)
            if op not in (Op.LOG, Op.METRICS):
                return messages.decode(op, payload)
        raise AssertionError("no control message from the worker")

    def load(self, settings: ModelSettings, index: int) -> messages.Loaded:
        self.channel.send_control(
            messages.Load(index=index, settings=settings.model_dump(mode="json"))
        )
        announced = self.control()  # which model it loads, should the load kill it
        assert isinstance(announced, messages.Loading) and announced.name == settings.name
        answer = self.control()
        while isinstance(answer, messages.Loading):  # (and each file its runtime opens)
            answer = self.control()
        assert isinstance(answer, messages.Loaded) and answer.index == index
        return answer

    def infer(self, index: int, body: bytes, kind: int = Kind.REST) -> tuple[ReplyHeader, bytes]:
        self.next_id += 1
        header = messages.request_header(self.next_id, index, kind, None, None, len(body))
        assert self.requests.push(header, body)
        os.eventfd_write(self.request_bell, 1)
        [(reply, answer)] = list(self.wait_replies(1))
        assert reply.request_id == self.next_id
        return reply, answer

    def wait_replies(self, count: int) -> Iterator[tuple[ReplyHeader, bytes]]:
        deadline = time.monotonic() + WAIT
        while count and time.monotonic() < deadline:
            select.select([self.reply_bell], [], [], 0.1)
            for fields, body in self.replies.pop_all():
                count -= 1
                yield ReplyHeader.of(fields), bytes(body)
        assert count == 0, "the worker did not answer"

    def close(self) -> None:
        self.channel.close()  # the worker exits on its own (and coverage saves its data)
        try:
            self.process.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(WAIT)
        self.requests.close()
        self.replies.close()
        os.close(self.request_bell)
        os.close(self.reply_bell)


@pytest.fixture
def worker() -> Iterator[Frontend]:
    frontend = Frontend()
    try:
        hello = frontend.control()
        assert isinstance(hello, messages.Hello) and hello.pid == frontend.process.pid
        yield frontend
    finally:
        frontend.close()


def rows(*values: list[float]) -> bytes:
    tensor = {"name": "x", "datatype": "FP64", "shape": [len(values), 2], "data": list(values)}
    return orjson.dumps({"inputs": [tensor]})


def test_a_loaded_model_answers_requests_through_the_rings(worker: Frontend) -> None:
    loaded = worker.load(SUMS, 3)
    assert loaded.ok and loaded.metadata["name"] == "sums" and loaded.size >= 0
    reply, body = worker.infer(3, rows([1, 2], [3, 4]))
    assert reply.status == 200, body
    [output] = orjson.loads(body)["outputs"]
    assert output["name"] == "sum" and output["data"] == [3.0, 7.0]
    assert reply.rows == 2


def test_a_bad_body_is_a_400_and_the_worker_serves_on(worker: Frontend) -> None:
    worker.load(SUMS, 3)
    reply, body = worker.infer(3, b"{not json")
    assert reply.status == 400 and b"not valid JSON" in body
    reply, _ = worker.infer(3, rows([1, 1]))
    assert reply.status == 200


def test_a_model_it_does_not_hold_is_not_ready_and_unload_drops_it(worker: Frontend) -> None:
    reply, body = worker.infer(9, rows([1, 1]))
    assert reply.status == 503
    assert b"worker 5 does not hold that model" in body
    worker.load(SUMS, 3)
    worker.channel.send_control(messages.Unload(index=3))
    worker.channel.send_control(messages.Ping())
    assert isinstance(worker.control(), messages.Pong)  # the unload came before it
    reply, body = worker.infer(3, rows([1, 1]))
    assert reply.status == 503 and b"does not hold" in body


def test_a_load_that_fails_says_why(worker: Frontend) -> None:
    broken = SUMS.model_copy(update={"implementation": "tests.support.no_such_module.Runtime"})
    answer = worker.load(broken, 4)
    assert not answer.ok
    assert "no_such_module" in answer.error
    worker.channel.send_control(messages.Ping())
    assert isinstance(worker.control(), messages.Pong)  # still serving


def test_stop_finishes_then_exits_cleanly(worker: Frontend) -> None:
    worker.load(SUMS, 3)
    worker.channel.send_control(messages.Stop())
    assert worker.process.wait(WAIT) == 0


def test_the_frontend_gone_ends_the_worker(worker: Frontend) -> None:
    worker.channel.close()
    assert worker.process.wait(WAIT) == 0
