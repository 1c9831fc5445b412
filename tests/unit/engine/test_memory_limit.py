"""The worker's memory limits (``engine/worker/memory_limit.py``), applied in a child
process (a limit can never be raised again in the process that set it), and which worker
the recycler finds due (``engine/pool/recycling.py``: the request budget and its jitter)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

from inferpool.engine.pool.recycling import JITTER, Recycler, private_bytes

CHILD = """
import numpy as np

from inferpool.engine.ipc.messages import Reply
from inferpool.engine.worker.memory_limit import MIB, MemoryLimit, install

limit = MemoryLimit(64 * MIB, threads=2)
install(limit)
for mib, max_memory, fits in [(16, None, True), (128, None, False), (16, 8, False),
                              (4, 8, True), (32, None, True), (128, 512, False)]:
    with limit.call(max_memory):  # as a worker runs a call: its errors answered inside
        try:
            np.ones(mib * MIB // 8)
        except MemoryError as exc:
            assert not fits, (mib, max_memory)
            reply = Reply.from_error(exc, "hog")
        else:
            assert fits, (mib, max_memory)
            continue
    print(reply.status, reply.body.decode())
    print("recycle:", limit.take_tripped())
print("done")
"""


NESTED = """
import numpy as np

from inferpool.engine.ipc.messages import Reply
from inferpool.engine.worker.memory_limit import MIB, MemoryLimit, install

limit = MemoryLimit(256 * MIB, threads=2)
install(limit)
with limit.call(64):  # a model capped at 64 MiB, whose predict waits in a call ...
    with limit.call(8):  # ... while the worker runs another model's call
        pass
    try:
        np.ones(128 * MIB // 8)
    except MemoryError as exc:
        print(Reply.from_error(exc, "outer").body.decode())
    else:
        print("not capped")
"""


def test_a_call_run_inside_another_gives_the_outer_its_cap_back() -> None:
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NESTED)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(
        "model 'outer' ran out of memory: its calls may allocate 64 MiB (its max_memory)"
    ), run.stdout


def test_the_limit_caps_allocations_and_max_memory_caps_a_call() -> None:
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[-1] == "done"
    worker, recycle, model, no_recycle, above, recycle_again = lines[:6]
    assert worker.startswith("500 model 'hog' ran out of memory: its worker may allocate 64 MiB")
    assert "(--worker-memory-limit)" in worker and "Unable to allocate 128" in worker
    # The worker's limit asks for a recycle; a model's max_memory does not.
    assert "Recycle(reason='memory_limit'" in recycle and "model 'hog' hit" in recycle
    assert model.startswith("500 model 'hog' ran out of memory: its calls may allocate 8 MiB")
    assert no_recycle == "recycle: None"
    # A max_memory above the worker's limit: the worker's limit is what the call hits.
    assert above.startswith("500 model 'hog' ran out of memory: its worker may allocate 64")
    assert "Recycle(reason='memory_limit'" in recycle_again


def test_without_a_limit_a_memory_error_is_the_models() -> None:
    run = subprocess.run(
        [sys.executable, "-c", CHILD.replace("64 * MIB", "0")
         .replace("(128, None, False)", "(1, None, True)")
         .replace("(128, 512, False)", "(128, 512, True)")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # Without a worker limit max_memory still caps the call (no recycle asked).
    assert run.returncode == 0, run.stderr
    first, recycle = run.stdout.splitlines()[:2]
    assert first.startswith("500 model 'hog' ran out of memory: its calls may allocate 8 MiB")
    assert recycle == "recycle: None"


class _Worker:
    """What the recycler reads of a worker (weakly referenced, as a ``WorkerHandle``)."""

    def __init__(self, sent: int) -> None:
        self.recycle: SimpleNamespace | None = None
        self.requests_sent = sent
        self.pid = 0

    def describe(self) -> str:
        return "worker 0"


def _worker(sent: int) -> _Worker:
    return _Worker(sent)


def test_each_worker_draws_its_request_budget_with_jitter() -> None:
    settings = SimpleNamespace(worker_max_requests=1000, worker_max_rss=0)
    recycler = Recycler(settings, None, None, None, None)  # type: ignore[arg-type]
    workers = [_worker(0) for _ in range(200)]
    for worker in workers:
        assert recycler._due(worker, measure=False) is None
    budgets = [recycler._budgets[worker] for worker in workers]
    assert min(budgets) >= 1000 and max(budgets) <= 1000 * (1 + JITTER)
    assert len(set(budgets)) > 50  # they do not all go at once
    for worker, budget in zip(workers[:5], budgets, strict=False):
        worker.requests_sent = budget - 1
        assert recycler._due(worker, measure=False) is None
        worker.requests_sent = budget
        reason, why = recycler._due(worker, measure=False)
        assert reason == "max_requests" and f"was sent {budget} requests" in why


def test_a_worker_that_asked_is_due_first() -> None:
    settings = SimpleNamespace(worker_max_requests=0, worker_max_rss=0)
    recycler = Recycler(settings, None, None, None, None)  # type: ignore[arg-type]
    worker = _worker(5)
    assert recycler._due(worker, measure=True) is None
    worker.recycle = SimpleNamespace(detail="model 'hog' hit the worker's memory limit (64 MiB)")
    assert recycler._due(worker, measure=False) == (
        "memory_limit",
        "worker 0: model 'hog' hit the worker's memory limit (64 MiB)",
    )


def test_private_bytes_counts_what_only_this_process_maps() -> None:
    import mmap
    import os

    before = private_bytes(os.getpid())
    # 32 MiB of fresh pages, each touched (malloc could hand back pages already counted).
    held = mmap.mmap(-1, 32 << 20)
    for offset in range(0, len(held), mmap.PAGESIZE):
        held[offset] = 1
    assert private_bytes(os.getpid()) - before >= 30 << 20
    held.close()
    assert private_bytes(2**22 + 7) is None  # no such process
