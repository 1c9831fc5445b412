"""Reloading a model through the repository API gives the replaced version's memory back.

A reload loads the new version next to the old one, then unloads the old one from every
worker: each worker's record already names the new version by then, so the unload must
not depend on it (it did: every reload left the old model in every worker).
"""

from __future__ import annotations

import httpx
import psutil

from tests.e2e.grpc_helpers import needs_pool
from tests.e2e.pool_support import wait_for, write_counting_model
from tests.support import Server

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
