"""``--workers 2`` under faults: a worker killed mid-load, full queues, failed placement."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.support import Server
from tests.support.pool import (
    calls,
    process_exists,
    sum_request,
    wait_for,
    worker_pids,
    write_counting_model,
)

pytestmark = pytest.mark.timeout(300)


async def post_all(url: str, bodies: list[dict]) -> list[tuple[httpx.Response, float]]:
    """POST every body at once; each response with the seconds it took."""

    async def one(client: httpx.AsyncClient, body: dict) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        response = await client.post(url, json=body)
        return response, time.monotonic() - started

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as client:
        return await asyncio.gather(*(one(client, body) for body in bodies))


def test_kill_9_fails_only_that_workers_requests_then_recovers(tmp_path: Path) -> None:
    calls_file = tmp_path / "calls.txt"
    write_counting_model(tmp_path / "repo", "slow", calls_file, delay=0.4)
    with Server(tmp_path / "repo", "--workers", "2") as server:
        server.wait_ready()
        victim = worker_pids(server)[0]
        url = f"{server.url}/v2/models/slow/infer"
        bodies = [sum_request([[i, 1, 1]], f"r{i}") for i in range(16)]

        async def kill_mid_load() -> list[tuple[httpx.Response, float]]:
            load = asyncio.ensure_future(post_all(url, bodies))
            await asyncio.sleep(0.6)  # both workers are busy with queued requests
            os.kill(victim, signal.SIGKILL)
            return await load

        results = asyncio.run(kill_mid_load())
        statuses = [response.status_code for response, _ in results]
        assert set(statuses) <= {200, 503}, statuses
        assert 503 in statuses and 200 in statuses
        for (response, seconds), body in zip(results, bodies, strict=True):
            if response.status_code == 200:
                assert response.json()["id"] == body["id"]
                assert response.json()["outputs"][0]["data"] == [sum(body["inputs"][0]["data"][0])]
            else:
                assert f"pid {victim}" in response.json()["error"]
                assert seconds < 20  # failed when the worker died, not on a timeout
        # The other worker still holds a replica: the server stays ready meanwhile.
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
        wait_for(lambda: worker_pids(server).get(0, victim) != victim, what="a new worker 0")
        assert not process_exists(victim)
        replacement = worker_pids(server)[0]
        served_before = len(calls(calls_file))

        def both_workers_serve() -> bool:
            results = asyncio.run(post_all(url, bodies[:4]))
            assert [r.status_code for r, _ in results] == [200] * 4
            pids = {pid for pid, _ in calls(calls_file)[served_before:]}
            return replacement in pids and len(pids) == 2

        wait_for(both_workers_serve, what="both workers serving again")
        assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
        assert server.stop() == 0


def test_full_queues_answer_503_with_retry_after(tmp_path: Path) -> None:
    write_counting_model(tmp_path / "repo", "slow", tmp_path / "calls.txt", delay=0.5)
    with Server(tmp_path / "repo", "--workers", "2", "--max-queue", "2") as server:
        server.wait_ready()
        bodies = [sum_request([[i, 0, 0]], f"r{i}") for i in range(12)]
        results = asyncio.run(post_all(f"{server.url}/v2/models/slow/infer", bodies))
        overloaded = [r for r, _ in results if r.status_code == 503]
        served = [r for r, _ in results if r.status_code == 200]
        assert len(overloaded) + len(served) == len(bodies)
        assert overloaded and len(served) >= 4
        assert all(r.headers.get("retry-after") == "1" for r in overloaded)
        assert all("queue is full" in r.json()["error"] for r in overloaded)
        for response in served:
            row = int(response.json()["id"][1:])
            assert response.json()["outputs"][0]["data"] == [float(row)]


def test_placement_failures_are_one_sentence(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_counting_model(repo, "three", tmp_path / "a.txt", replicas=3)
    write_counting_model(repo, "big", tmp_path / "b.txt", ballast_mb=40)
    write_counting_model(repo, "small", tmp_path / "c.txt")
    args = ("--workers", "2", "--worker-memory-limit", "30", "--no-exit-on-error")
    with Server(repo, *args) as server:
        server.wait_live()
        index_url = f"{server.url}/v2/repository/index"

        def settled() -> bool:
            states = {m["state"] for m in httpx.post(index_url).json()}
            return "LOADING" not in states and len(states) > 0

        wait_for(settled, what="every model loaded or failed")
        index = {m["name"]: m for m in httpx.post(index_url).json()}
        assert index["small"]["state"] == "READY"
        assert index["three"]["state"] == "FAILED"
        three = "cannot place 3 replicas of 'three': 2 workers; 2 with room"
        assert index["three"]["reason"] == three
        assert index["big"]["state"] == "FAILED"
        assert re.fullmatch(
            r"cannot place 2 replicas of 'big': 2 workers; 2 have at most (29|30) MiB free "
            r"\(needs 4\d MiB\)",
            index["big"]["reason"],
        ), index["big"]["reason"]
        ready = httpx.get(f"{server.url}/v2/health/ready")
        assert ready.status_code == 503
        assert "cannot place" in ready.json()["error"]


def test_a_hung_worker_is_killed_and_replaced(tmp_path: Path) -> None:
    write_counting_model(tmp_path / "repo", "stuck", tmp_path / "calls.txt", delay=600)
    # No model timeout: the heartbeat is what finds the hung worker.
    args = ("--workers", "2", "--worker-heartbeat-timeout", "2", "--model-timeout", "0")
    with Server(tmp_path / "repo", *args) as server:
        server.wait_ready()
        before = worker_pids(server)
        started = time.monotonic()
        response = httpx.post(
            f"{server.url}/v2/models/stuck/infer", json=sum_request([[1, 1, 1]], "h"), timeout=60
        )
        assert response.status_code == 503
        assert "exited while running the request" in response.json()["error"]
        assert time.monotonic() - started < 30
        assert "answered nothing for 2s; killing it" in server.output()
        wait_for(lambda: worker_pids(server) != before, what="a replacement worker")
        assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
