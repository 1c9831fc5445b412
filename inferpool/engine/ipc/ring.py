"""A single-producer / single-consumer ring of fixed-size slots in anonymous shared memory.

The ring lives in a memfd (never a /dev/shm name, so nothing outlives the processes)
mapped by both sides. The first cache line holds the consumer's ``head``, the second the
producer's ``tail``; each is written by one side only and read by the other. The third
is the consumer's *running* record: which model and requests it is running and since
when (``mark_running``), so that the producer can tell which model a dead worker was
running, and which group runs past its model's timeout, without asking it. A slot is a
``messages.HEADER`` followed by the body. No asyncio here: the doorbell (an eventfd) is
the caller's business, so one doorbell write can announce many slots.

Ordering rests on the two counters alone, each a 64-bit word stored with release and
loaded with acquire semantics (``atomics.py``: the C functions of ``_atomics.c``, one
instruction each on any CPU, arm64's weaker ordering included). The producer writes a
slot, then release-stores ``tail``; the consumer acquire-loads ``tail``, so it sees
every byte of the slots before it, copies them out, then release-stores ``head``; the
producer acquire-loads ``head`` before it reuses a slot, so it never overwrites bytes
the consumer is still reading. The counters are in native byte order (both sides run on
one machine). The running record is plain bytes, unordered: a read racing
``mark_running`` may mix two groups' fields (the producer reads it only to attribute a
crash or a timeout).

The fourth line is the consumer's *asleep* word, for the doorbell: the consumer sets it
before it blocks (``may_sleep``) and clears it when it wakes (``awake``); the producer
rings only when it is set (``needs_bell``). A consumer that is busy is not woken for
every message: it finds them when it next looks. The consumer stores the word then loads
``tail``, the producer stores ``tail`` then loads the word, all four sequentially
consistent: at least one side sees the other's store, so either the producer rings or the
consumer does not block (a stale set word only costs a ring that was not needed).
"""

from __future__ import annotations

import mmap
import os
import struct

from inferpool.engine.ipc.atomics import (
    NATIVE,
    load_acquire,
    load_seq_cst,
    store_release,
    store_seq_cst,
)
from inferpool.engine.ipc.messages import HEADER, HEADER_SIZE

_HEAD, _TAIL, _RUNNING_AT, _ASLEEP, _SLOTS_AT = 0, 64, 128, 192, 256
# started (monotonic ns, 0: idle), model index, requests in the group, their first ids.
RUNNING_IDS = 6
_RUNNING = struct.Struct(f"<qII{RUNNING_IDS}Q")
_NO_IDS = (0,) * RUNNING_IDS
_ONE = struct.Struct("<qIIQ")  # the same record for a group of one (stale ids after it)
_IDLE = struct.Struct("<q")  # the record's first field alone


def ring_bytes(slots: int, slot_size: int) -> int:
    return _SLOTS_AT + slots * slot_size


def create_ring_fd(slots: int, slot_size: int) -> int:
    """A zero-filled memfd big enough for a ring (pages are only allocated when touched)."""
    fd = os.memfd_create("inferpool-ring", os.MFD_CLOEXEC)
    os.ftruncate(fd, ring_bytes(slots, slot_size))
    return fd


class Ring:
    """One side of a ring mapped from ``fd``; the fd may be closed once this exists."""

    def __init__(self, fd: int, slots: int, slot_size: int) -> None:
        if slot_size <= HEADER_SIZE or slots < 1:
            raise ValueError("a ring needs at least one slot bigger than the header")
        self.slots = slots
        self.slot_size = slot_size
        self.capacity = slot_size - HEADER_SIZE  # the largest body a slot holds
        self._map = mmap.mmap(fd, ring_bytes(slots, slot_size))
        # Each side's own counter, and the other side's as last loaded: the consumer's
        # ``head`` and the producer's ``tail`` are exact, the producer's ``head`` may lag.
        self._head: int = load_acquire(self._map, _HEAD)
        self._tail: int = load_acquire(self._map, _TAIL)

    def _slot(self, position: int) -> int:
        return _SLOTS_AT + (position % self.slots) * self.slot_size

    # -- producer --------------------------------------------------------------------------
    def push(self, header: bytes, body: bytes) -> bool:
        """Write one message; False when the ring is full or the body needs its own memfd."""
        if len(body) > self.capacity:
            return False
        tail = self._tail
        # The head last loaded is enough while it shows a free slot (it only moves on):
        # load it again, with acquire, only when the ring looks full.
        if tail - self._head >= self.slots:
            self._head = load_acquire(self._map, _HEAD)
            if tail - self._head >= self.slots:
                return False
        start = self._slot(tail)
        self._map[start : start + HEADER_SIZE] = header
        self._map[start + HEADER_SIZE : start + HEADER_SIZE + len(body)] = body
        self._tail = tail + 1
        # Publishes the slot's bytes (a release), and comes before ``needs_bell``'s load.
        store_seq_cst(self._map, _TAIL, tail + 1)
        return True

    @property
    def produced(self) -> int:
        """Messages this producer has written so far."""
        return self._tail

    def find(self, request_ids: set[int]) -> dict[int, tuple[tuple[int, ...], bytes]]:
        """The messages of ``request_ids`` that the slots still hold, by request id, as
        (header fields, body): taken by the consumer or not, a slot keeps its bytes until
        the producer reuses it. Only the producer calls this (it alone writes the slots, so
        each slot's header and body are of one message); a stalled consumer's queued
        requests are moved to another worker this way (``engine/pool/stalls.py``)."""
        found = {}
        # The last ``slots`` messages written (a slot never written is left untouched).
        for position in range(max(0, self._tail - self.slots), self._tail):
            start = self._slot(position)
            fields = HEADER.unpack_from(self._map, start)
            if fields[0] in request_ids:
                body_at = start + HEADER_SIZE
                found[fields[0]] = (fields, self._map[body_at : body_at + fields[-1]])
        return found

    def needs_bell(self) -> bool:
        """Whether the consumer may be blocked (or about to be): ring its doorbell after
        ``push``. Always True without the C functions (see ``atomics.NATIVE``)."""
        return not NATIVE or load_seq_cst(self._map, _ASLEEP) != 0

    # -- consumer --------------------------------------------------------------------------
    def pop_all(self) -> list[tuple[tuple[int, ...], bytes]]:
        """Every message written so far, as (header fields, body), freeing their slots."""
        head = self._head
        tail = load_acquire(self._map, _TAIL)  # the slots before it are complete
        if head == tail:
            return []
        messages = []
        while head < tail:
            start = self._slot(head)
            fields = HEADER.unpack_from(self._map, start)
            body_at = start + HEADER_SIZE
            messages.append((fields, self._map[body_at : body_at + fields[-1]]))
            head += 1
        self._head = head
        store_release(self._map, _HEAD, head)  # after the copies: the slots are free
        return messages

    def may_sleep(self) -> bool:
        """Say the consumer is about to block on its doorbell; False when a message came
        in the meantime (then it must not block: no bell may come for it)."""
        store_seq_cst(self._map, _ASLEEP, 1)
        return load_seq_cst(self._map, _TAIL) == self._head

    def awake(self) -> None:
        """The consumer is running again: the producer need not ring for what it pushes."""
        store_release(self._map, _ASLEEP, 0)

    def mark_running(self, model_index: int, request_ids: list[int], started_ns: int) -> None:
        """Record the group about to run (one small write: cheap on the hot path)."""
        count = len(request_ids)
        if count == 1:  # the common case, without building a tuple
            _ONE.pack_into(self._map, _RUNNING_AT, started_ns, model_index, 1, request_ids[0])
            return
        ids = (*request_ids[:RUNNING_IDS], *_NO_IDS)[:RUNNING_IDS]
        _RUNNING.pack_into(self._map, _RUNNING_AT, started_ns, model_index, count, *ids)

    def mark_idle(self) -> None:
        _IDLE.pack_into(self._map, _RUNNING_AT, 0)

    def running(self) -> tuple[int, list[int], int] | None:
        """(model index, request ids (the first few), started ns) of the running group."""
        fields = _RUNNING.unpack_from(self._map, _RUNNING_AT)
        if fields[0] == 0:
            return None
        return fields[1], list(fields[3 : 3 + min(fields[2], RUNNING_IDS)]), fields[0]

    def running_group(self) -> tuple[int, int, int] | None:
        """(model index, requests in the group, its first request id) of the running group:
        its size even past ``RUNNING_IDS``, for the metrics' queued-requests gauge."""
        started, model_index, count, first = _ONE.unpack_from(self._map, _RUNNING_AT)
        return None if started == 0 else (model_index, count, first)

    def pending(self) -> int:
        """Messages written and not yet taken (right on either side)."""
        head = load_acquire(self._map, _HEAD)
        return load_acquire(self._map, _TAIL) - head

    def close(self) -> None:
        self._map.close()
