"""Worker recycling's decisions (``engine/pool/recycling.py``) and the pool's answers to
the supervisor (``engine/pool/pool.py``) on a ``PoolClient`` that starts no process: which
worker is due (its request budget, its memory limit, its private memory) and which is
skipped, a fresh worker taking over the slot, a recycle whose fresh worker does not start
(the old one keeps serving, tried again later), and the pool's events when no model is
placed. Real recycles: tests/e2e/test_worker_recycling.py (tox -e slow)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

from inferpool.engine.ipc import messages
from inferpool.engine.pool import recycling
from inferpool.engine.pool.pool import PoolClient
from inferpool.engine.pool.recycling import JITTER, MIB, RETRY_AFTER
from inferpool.errors import WorkerLost
from inferpool.settings import ServerSettings
from tests.unit.engine.pool.test_supervisor_workers import Worker


class Served(Worker):
    """A worker as the recycler reads it: requests sent, a memory-limit verdict."""

    def __init__(self, slot: int, sent: int = 0, started: bool = True) -> None:
        super().__init__(slot, started=started)
        self.pid = 4000 + slot
        self.requests_sent = sent
        self.recycle: Any = None


def pool(**settings: Any) -> tuple[PoolClient, list[str]]:
    """A pool of two slots whose background work is recorded, not run."""
    client = PoolClient(ServerSettings(workers=2, **settings))
    kept: list[str] = []

    def keep(work: Coroutine[Any, Any, Any]) -> None:
        kept.append(work.__qualname__)
        work.close()

    client.supervisor.keep = keep  # type: ignore[method-assign]
    return client, kept


def test_a_worker_past_its_request_budget_is_due_one_at_a_time() -> None:
    client, kept = pool(worker_max_requests=100)
    budget = 100 + int(100 * JITTER)
    early, due, later = Served(0, sent=99), Served(1, sent=budget), Served(1, sent=budget)
    client.supervisor.workers[:] = [early, due]  # type: ignore[list-item]
    recycler = client.recycler
    recycler.tick(time.monotonic())
    assert kept == ["Recycler._recycle"]
    assert recycler._due(early, False) is None  # type: ignore[arg-type]
    sentence = f"worker 1 (pid 4001) was sent {budget} requests (--worker-max-requests 100)"
    assert recycler._due(due, False) == ("max_requests", sentence)  # type: ignore[arg-type]
    client.supervisor.workers[1] = later  # type: ignore[call-overload]
    recycler.tick(time.monotonic())  # one recycle runs: no second one
    assert kept == ["Recycler._recycle"]


def test_workers_not_started_or_waiting_for_a_retry_are_skipped() -> None:
    client, kept = pool(worker_max_requests=1)
    starting, retried = Served(0, sent=50, started=False), Served(1, sent=50)
    client.supervisor.workers[:] = [starting, retried]  # type: ignore[list-item]
    client.recycler._retry[retried] = time.monotonic() + RETRY_AFTER  # type: ignore[index]
    client.recycler.tick(time.monotonic())
    assert kept == []


def test_a_worker_over_its_memory_limit_is_due() -> None:
    client, _ = pool()
    worker = Served(0)
    worker.recycle = SimpleNamespace(detail="mapped 900 MiB over its limit")
    assert client.recycler._due(worker, False) == (  # type: ignore[arg-type]
        "memory_limit", "worker 0 (pid 4000): mapped 900 MiB over its limit"
    )  # fmt: skip


def test_private_memory_over_max_rss(monkeypatch, caplog) -> None:
    client, kept = pool(worker_max_rss=100)
    monkeypatch.setattr(recycling, "private_bytes", lambda pid: 150 * MIB)
    recycler = client.recycler
    busy = Served(0, sent=3)
    assert recycler._due(busy, True) == (  # type: ignore[arg-type]
        "max_rss", "worker 0 (pid 4000) holds 150 MiB of private memory (--worker-max-rss 100 MiB)"
    )  # fmt: skip
    # Over the limit before serving anything: a fresh worker would be too; given up, once.
    with caplog.at_level(logging.ERROR):
        assert recycler._due(Served(1), True) is None  # type: ignore[arg-type]
    assert "before serving a request, over --worker-max-rss 100 MiB" in caplog.text
    assert recycler.max_rss == 0
    client.supervisor.workers[:] = [busy, None]  # type: ignore[list-item]
    recycler.tick(time.monotonic() + 1)  # memory is not measured any more: nothing is due
    assert kept == []


def test_a_fresh_worker_takes_over_and_the_old_one_retires() -> None:
    client, kept = pool(worker_max_requests=1)
    old, fresh = Served(0, sent=5), Served(0)
    fresh.pid = 5000
    client.supervisor.workers[0] = old  # type: ignore[call-overload]

    async def spawn(slot: int) -> Served:
        client.supervisor.spares.add(fresh)  # type: ignore[arg-type]
        return fresh

    client.supervisor.spawn = spawn  # type: ignore[method-assign, assignment]
    client.recycler._running = True
    asyncio.run(client.recycler._recycle(old, "max_requests", "why"))  # type: ignore[arg-type]
    assert client.supervisor.workers[0] is fresh
    assert old.retiring and [type(m) for m in old.sent] == [messages.Stop]
    assert client.recycler.counts["max_requests"] == 1
    assert not client.recycler._running
    assert kept == ["Supervisor._kill_unless_exited"]


def test_a_recycle_whose_fresh_worker_does_not_start_keeps_the_old_one(caplog) -> None:
    client, _ = pool(worker_max_requests=1)
    old = Served(1, sent=5)
    client.supervisor.workers[1] = old  # type: ignore[call-overload]

    async def spawn(slot: int) -> Served:
        raise WorkerLost("worker 1 did not start in 60s")

    client.supervisor.spawn = spawn  # type: ignore[method-assign, assignment]
    with caplog.at_level(logging.ERROR):
        asyncio.run(client.recycler._recycle(old, "max_requests", "why"))  # type: ignore[arg-type]
    assert client.supervisor.workers[1] is old and not old.retiring
    assert client.recycler._retry[old] > time.monotonic()  # type: ignore[index]
    assert (
        "cannot recycle worker 1 (pid 4001) (it keeps serving; tried again in 30s)" in caplog.text
    )
    assert client.recycler.counts["max_requests"] == 0


def test_the_pools_answers_with_no_model_placed() -> None:
    client, _ = pool(model_timeout=7)
    assert client.timeout_of(3) == 7.0  # no route: the server's model timeout
    assert client.model_name(3) is None
    client.quarantine(3, "crashed its workers")  # nothing to quarantine
    assert client.shared_documents() == []
    worker = Served(0)
    client.supervisor.workers[0] = worker  # type: ignore[call-overload]
    client.set_log_levels({"": logging.WARNING})
    assert [type(m) for m in worker.sent] == [messages.LogLevels]
    assert worker.sent[0].levels == {"": logging.WARNING}
    logging.getLogger().setLevel(logging.WARNING)
