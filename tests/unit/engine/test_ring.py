"""The memfd slot ring: order, wrap-around, full and oversized messages, two mappings."""

from __future__ import annotations

import os

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.ring import Ring, create_ring_fd


def make_pair(slots: int = 4, slot_size: int = 256) -> tuple[Ring, Ring]:
    fd = create_ring_fd(slots, slot_size)
    try:
        return Ring(fd, slots, slot_size), Ring(fd, slots, slot_size)
    finally:
        os.close(fd)


def header(request_id: int, length: int) -> bytes:
    return messages.request_header(request_id, 1, 0, None, None, length)


def test_messages_arrive_in_order_through_another_mapping() -> None:
    producer, consumer = make_pair()
    for i in range(3):
        assert producer.push(header(i, 3 + i), b"x" * (3 + i))
    got = consumer.pop_all()
    assert [(fields[0], body) for fields, body in got] == [(i, b"x" * (3 + i)) for i in range(3)]
    assert consumer.pop_all() == []


def test_full_ring_refuses_until_consumed_and_wraps_around() -> None:
    producer, consumer = make_pair(slots=2)
    for round_ in range(5):
        assert producer.push(header(2 * round_, 1), b"a")
        assert producer.push(header(2 * round_ + 1, 1), b"b")
        assert not producer.push(header(99, 1), b"c")  # full
        assert [f[0] for f, _ in consumer.pop_all()] == [2 * round_, 2 * round_ + 1]


def test_body_bigger_than_a_slot_is_refused() -> None:
    producer, consumer = make_pair(slot_size=256)
    assert producer.capacity == 256 - messages.HEADER_SIZE
    assert not producer.push(header(1, producer.capacity + 1), b"z" * (producer.capacity + 1))
    assert producer.push(header(2, producer.capacity), b"z" * producer.capacity)
    [(fields, body)] = consumer.pop_all()
    assert fields[0] == 2 and body == b"z" * producer.capacity


def test_reply_header_carries_status_and_stage_times() -> None:
    raw = messages.reply_header(5, 503, 17, (1, 2, 3, 4), 9)
    fields = messages.HEADER.unpack(raw)
    assert fields[0] == 5 and fields[4] == 503 and fields[5] == 17
    assert fields[8:12] == (1, 2, 3, 4) and fields[-1] == 9
