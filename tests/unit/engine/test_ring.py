"""The memfd slot ring: order, wrap-around, full and oversized messages, two mappings;
and the acquire/release counter functions it rests on (``_atomics``)."""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import signal
import struct
import time

import pytest

from inferpool.engine.ipc import messages
from inferpool.engine.ipc._atomics import load_acquire, load_seq_cst, store_release, store_seq_cst
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


def test_pending_is_right_on_either_side_and_a_new_mapping_resumes_at_the_counters() -> None:
    producer, consumer = make_pair(slots=4)
    for i in range(3):
        assert producer.push(header(i, 1), b"x")
    assert producer.pending() == consumer.pending() == 3
    assert [f[0] for f, _ in consumer.pop_all()] == [0, 1, 2]
    assert producer.pending() == 0
    fd = create_ring_fd(4, 256)
    try:
        first = Ring(fd, 4, 256)
        assert first.push(header(7, 1), b"a") and first.push(header(8, 1), b"b")
        assert [f[0] for f, _ in first.pop_all()] == [7, 8]
        assert first.push(header(9, 1), b"c")
        later = Ring(fd, 4, 256)  # mapped after two messages went through
    finally:
        os.close(fd)
    assert [f[0] for f, _ in later.pop_all()] == [9]


# -- the counters ------------------------------------------------------------------------
NATIVE_COUNTER = struct.Struct("=Q")
# Each store with its load: the same checks for both memory orders.
ORDERS = pytest.mark.parametrize(
    ("store", "load"),
    [(store_release, load_acquire), (store_seq_cst, load_seq_cst)],
    ids=["release-acquire", "seq_cst"],
)


@ORDERS
@pytest.mark.parametrize("value", [0, 1, 0x0102030405060708, 2**64 - 1])
def test_a_stored_counter_loads_back_and_touches_only_its_8_bytes(value: int, store, load) -> None:
    buffer = mmap.mmap(-1, 4096)
    buffer[:] = b"\xee" * 4096
    store(buffer, 64, value)
    assert load(buffer, 64) == value
    assert NATIVE_COUNTER.unpack_from(buffer, 64)[0] == value  # a plain word, native order
    assert buffer[56:64] == buffer[72:80] == b"\xee" * 8
    buffer.close()  # would fail if a call had left its buffer exported


@ORDERS
@pytest.mark.parametrize("offset", [1, 4, 60, 4095 - 8])
def test_an_unaligned_offset_is_refused(offset: int, store, load) -> None:
    buffer = mmap.mmap(-1, 4096)
    with pytest.raises(ValueError, match="not 8-byte aligned"):
        store(buffer, offset, 1)
    with pytest.raises(ValueError, match="not 8-byte aligned"):
        load(buffer, offset)
    buffer.close()


@ORDERS
@pytest.mark.parametrize("offset", [-8, 4096, 4096 - 4, 2**64, -(2**70)])
def test_an_offset_outside_the_buffer_is_refused(offset: int, store, load) -> None:
    buffer = mmap.mmap(-1, 4096)
    with pytest.raises(ValueError, match="outside a buffer of 4096 bytes"):
        store(buffer, offset, 1)
    with pytest.raises(ValueError, match="outside a buffer of 4096 bytes"):
        load(buffer, offset)
    store(buffer, 4096 - 8, 5)  # the last word is inside
    assert load(buffer, 4096 - 8) == 5
    with pytest.raises(ValueError, match="outside a buffer of 4 bytes"):
        load(bytearray(4), 0)
    buffer.close()


@ORDERS
def test_a_read_only_buffer_is_refused(store, load) -> None:
    fd = create_ring_fd(1, 4096)
    try:
        read_only = mmap.mmap(fd, 4096, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    for buffer in (read_only, bytes(64)):
        with pytest.raises(BufferError):
            store(buffer, 0, 1)
        with pytest.raises(BufferError):
            load(buffer, 0)
    read_only.close()


@ORDERS
def test_a_value_that_is_not_an_unsigned_64_bit_int_is_refused_before_the_store(
    store, load
) -> None:
    buffer = mmap.mmap(-1, 64)
    store(buffer, 8, 42)
    for value in (-1, 2**64):
        with pytest.raises(OverflowError):
            store(buffer, 8, value)
    with pytest.raises(TypeError):
        store(buffer, 8, 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        load(buffer, "8")  # type: ignore[arg-type]
    assert load(buffer, 8) == 42
    buffer.close()


def test_the_x86_fallback_stores_and_loads_the_same_words_as_the_c_functions() -> None:
    from inferpool.engine.ipc import atomics

    assert atomics.NATIVE  # the checkout's build has the C extension: the ring uses it
    buffer = bytearray(16)
    atomics._store(buffer, 8, 2**64 - 1)
    assert load_acquire(buffer, 8) == 2**64 - 1
    store_release(buffer, 0, 12345)
    assert atomics._load(buffer, 0) == 12345 and buffer[8:] == b"\xff" * 8


# -- the doorbell word -----------------------------------------------------------------------
def test_the_producer_rings_only_while_the_consumer_may_sleep() -> None:
    producer, consumer = make_pair()
    assert not producer.needs_bell()  # a new consumer runs: it reads the ring first
    assert consumer.may_sleep()  # nothing pending: it may block
    assert producer.push(header(1, 1), b"a")
    assert producer.needs_bell()
    consumer.awake()
    assert producer.push(header(2, 1), b"b")
    assert not producer.needs_bell()  # it runs: it finds the message when it next looks
    assert [fields[0] for fields, _ in consumer.pop_all()] == [1, 2]


def test_a_consumer_with_a_message_it_has_not_read_must_not_block() -> None:
    producer, consumer = make_pair()
    assert producer.push(header(1, 1), b"a")  # pushed while it ran: no bell
    assert not consumer.may_sleep()
    consumer.pop_all()
    assert consumer.may_sleep()


def test_without_the_c_functions_the_producer_always_rings(monkeypatch) -> None:
    from inferpool.engine.ipc import ring

    producer, _consumer = make_pair()
    monkeypatch.setattr(ring, "NATIVE", False)  # the fallback cannot order store then load
    assert producer.push(header(1, 1), b"a")
    assert producer.needs_bell()


WAKE_MESSAGES = 20_000


def test_no_message_waits_for_a_bell_that_never_comes() -> None:
    """A producer process pushes in bursts and pauses and rings only when ``needs_bell``
    says; the consumer blocks on the bell whenever ``may_sleep`` lets it. A lost wake-up
    leaves a message unread while the consumer blocks: its poll times out (2 s, against
    pauses of at most 0.2 ms), and the test fails."""
    producer, consumer = make_pair(slots=8, slot_size=256)
    bell = os.eventfd(0, os.EFD_NONBLOCK)
    pid = os.fork()
    if pid == 0:  # the producer: bursts of 1-12 messages, then a pause of 0-200 µs
        status = 1
        try:
            sent, burst = 0, 0
            while sent < WAKE_MESSAGES:
                if producer.push(header(sent, 8), sent.to_bytes(8, "little")):
                    if producer.needs_bell():
                        os.eventfd_write(bell, 1)
                    sent += 1
                    burst += 1
                    if burst > sent * 7919 % 12:
                        burst = 0
                        time.sleep(sent * 104729 % 200 / 1e6)
                else:
                    os.sched_yield()  # full: the consumer frees slots without a bell
            status = 0
        finally:
            os._exit(status)
    poller = select.poll()
    poller.register(bell, select.POLLIN)
    received, lost = 0, 0
    try:
        while received < WAKE_MESSAGES:
            if consumer.may_sleep() and not poller.poll(2000):
                lost += 1
                break
            consumer.awake()
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(bell)
            for fields, body in consumer.pop_all():
                assert fields[0] == received == int.from_bytes(body, "little")
                received += 1
    finally:
        if lost:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(bell)
    assert lost == 0, f"the consumer waited for a bell with message {received} unread"
    assert received == WAKE_MESSAGES
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_producer_finds_the_messages_its_slots_still_hold() -> None:
    """A stalled consumer's queued requests are read back (``engine/pool/stalls.py``): taken or not,
    a slot holds its message until the producer writes it again; an id never pushed, or
    whose slot was written again, is not found."""
    producer, consumer = make_pair(slots=4)
    for i in range(1, 4):
        assert producer.push(header(i, 2), bytes([i, i]))
    consumer.pop_all()  # taken (a worker's batcher holds them now): still in their slots
    assert producer.push(header(4, 1), b"d")  # not taken
    found = producer.find({2, 4, 99})
    assert {i: body for i, (_, body) in found.items()} == {2: b"\x02\x02", 4: b"d"}
    assert found[2][0][:2] == (2, 1) and found[2][0][-1] == 2  # id, model index, length
    consumer.pop_all()
    for i in range(5, 7):  # slots of 1 and 2 written again
        assert producer.push(header(i, 1), b"e")
    assert set(producer.find({1, 2, 3, 4, 5, 6})) == {3, 4, 5, 6}
