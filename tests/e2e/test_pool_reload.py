"""Reloading a model through the repository API: no request is lost, and the replaced
version's memory comes back.

A reload loads the new version next to the old one, then unloads the old one from every
worker: each worker's record already names the new version by then, so the unload must
not depend on it (it did: every reload left the old model in every worker). A request
pushed to a worker's ring just before the unload reached it must still be answered by the
version it was sent to (it was answered 503 "does not hold that model").
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import psutil

from tests.support import Server
from tests.support.grpc import needs_pool
from tests.support.pool import wait_for, write_counting_model

BALLAST_MB = 40


def workers_rss(server: Server) -> int:
    template = psutil.Process(server.process.pid).children()
    return sum(w.memory_info().rss for t in template for w in t.children())


@needs_pool
def test_reloads_and_an_unload_give_the_models_memory_back(tmp_path):
    write_counting_model(tmp_path, "heavy", tmp_path / "calls", ballast_mb=BALLAST_MB)
    with Server(tmp_path, "--workers", "2") as server:
        server.wait_ready(120)
        before = workers_rss(server)
        for _ in range(4):
            reply = httpx.post(f"{server.url}/v2/repository/models/heavy/load", timeout=60)
            assert reply.status_code == 200, reply.text
        # Unloads are control messages: give the workers a moment to act on them.
        mib = 1024 * 1024
        wait_for(lambda: workers_rss(server) < before + BALLAST_MB * mib, 10, "reload memory back")
        reply = httpx.post(f"{server.url}/v2/repository/models/heavy/unload", timeout=60)
        assert reply.status_code == 200, reply.text
        # Both workers held one replica each; both are gone now.
        wait_for(lambda: workers_rss(server) < before - BALLAST_MB * mib, 10, "unload memory back")


@needs_pool
def test_requests_sent_while_a_model_reloads_are_all_answered(tmp_path):
    write_counting_model(tmp_path, "busy", tmp_path / "calls")
    body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64", "data": [[1, 2, 3]]}]}

    async def load(server: Server) -> tuple[Counter, int]:
        outcomes: Counter = Counter()
        stop = time.monotonic() + 10
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

            async def send() -> None:
                while time.monotonic() < stop:
                    reply = await client.post("/v2/models/busy/infer", json=body)
                    outcomes[reply.status_code if reply.status_code == 200 else reply.text] += 1

            async def reload() -> int:
                count = 0
                while time.monotonic() < stop:
                    reply = await client.post("/v2/repository/models/busy/load")
                    assert reply.status_code == 200, reply.text
                    count += 1
                return count

            reloads, *_ = await asyncio.gather(reload(), *(send() for _ in range(32)))
        return outcomes, reloads

    with Server(tmp_path, "--workers", "2") as server:
        server.wait_ready(120)
        outcomes, reloads = asyncio.run(load(server))
    assert reloads >= 10, reloads
    assert outcomes[200] > 500, outcomes
    assert set(outcomes) == {200}, outcomes
