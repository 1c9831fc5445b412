"""The control channel: inline and memfd-spilled messages, fd passing, EOF."""

from __future__ import annotations

import os

import pytest

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.channel import INLINE_LIMIT, Channel, socket_pair


@pytest.fixture
def pair():
    a, b = socket_pair()
    left, right = Channel(a), Channel(b)
    yield left, right
    left.close()
    right.close()


def test_small_message_inline(pair) -> None:
    left, right = pair
    left.send(3, b"hello ", b"world")
    assert right.receive() == (3, b"hello world", [])


def test_big_message_travels_in_a_memfd(pair) -> None:
    left, right = pair
    big = os.urandom(INLINE_LIMIT * 5)
    left.send(6, b"head", big)
    op, payload, fds = right.receive()
    assert (op, payload, fds) == (6, b"head" + big, [])


def test_a_spilled_request_or_reply_is_dispatched_as_its_header_and_body(pair) -> None:
    """The parts go to the memfd in one writev and come back apart (``messages.Parts``):
    the body is not copied again to cut the slot header off. Other ops, and a request
    small enough to go inline, come as one bytes."""
    left, right = pair
    header = bytes(range(messages.HEADER_SIZE))
    big = os.urandom(INLINE_LIMIT * 5)
    left.send(messages.Op.REPLY, header, big)
    left.send(messages.Op.REQUEST, header, b"small")
    left.send(0x55, b"other", big)
    got: list = []
    assert right.dispatch_pending(lambda op, payload: got.append((op, payload)))
    (reply_op, reply), (request_op, small), (other_op, other) = got
    assert reply_op == messages.Op.REPLY and reply == messages.Parts(header, big)
    assert messages.header_and_body(reply) == (header, big)
    assert request_op == messages.Op.REQUEST and small == header + b"small"
    assert messages.header_and_body(small) == (small, b"small")
    assert other_op == 0x55 and other == b"other" + big


def test_fds_cross_and_work(pair) -> None:
    left, right = pair
    read_end, write_end = os.pipe()
    left.send(8, b"{}", fds=[write_end])
    os.close(write_end)
    op, payload, fds = right.receive()
    assert op == 8 and payload == b"{}" and len(fds) == 1
    os.write(fds[0], b"ping")
    os.close(fds[0])
    assert os.read(read_end, 4) == b"ping"
    os.close(read_end)


def test_nonblocking_receive_and_eof() -> None:
    a, b = socket_pair()
    left, right = Channel(a), Channel(b)
    with pytest.raises(BlockingIOError):
        right.receive(block=False)
    left.close()
    with pytest.raises(EOFError):
        right.receive(block=False)
    right.close()


def test_nonblocking_send_reports_a_full_socket(pair) -> None:
    from inferpool.engine.ipc.channel import Outgoing

    left, right = pair
    sent = 0
    with pytest.raises(BlockingIOError):
        for _ in range(100_000):  # bounded: the socket buffer fills long before
            left.send_packed(Outgoing(5, [b"x" * 1024]), block=False)
            sent += 1
    assert sent > 0
    assert right.receive() == (5, b"x" * 1024, [])
    big = Outgoing(6, [os.urandom(INLINE_LIMIT * 2)])
    left.send_packed(big, block=False)  # room again after one receive
    assert big.spill is None  # our copy of the memfd is released once sent
