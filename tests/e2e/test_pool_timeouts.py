"""A hung predict is bounded: 504 at its model's timeout, and shutdown keeps its grace period.

Before: every model has a replica on every worker, so two hung calls blocked every
model until the heartbeat (120 s) killed the workers; and SIGTERM with a hung request
took twice the grace period.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support import Server
from tests.support.pool import (
    calls,
    live_workers,
    sum_request,
    wait_for,
    worker_pids,
    write_counting_model,
)

pytestmark = pytest.mark.timeout(300)


def test_a_hung_model_is_504_at_its_timeout_and_blocks_no_other(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_counting_model(repo, "sleepy", tmp_path / "sleepy.txt", delay=600, timeout=1)
    write_counting_model(repo, "quick", tmp_path / "quick.txt")
    with Server(repo, "--workers", "2") as server:
        server.wait_ready()
        before = worker_pids(server)

        async def run() -> tuple[list[tuple[httpx.Response, float]], list[tuple[int, float, str]]]:
            async with httpx.AsyncClient(timeout=30) as client:

                async def timed(model: str, i: int) -> tuple[httpx.Response, float]:
                    started = time.monotonic()
                    url = f"{server.url}/v2/models/{model}/infer"
                    response = await client.post(url, json=sum_request([[i, 1, 1]], f"{i}"))
                    return response, time.monotonic() - started

                # Two hung calls: one on each worker.
                hung = [asyncio.ensure_future(timed("sleepy", i)) for i in range(2)]
                await asyncio.sleep(0.3)
                others = []
                for i in range(15):  # meanwhile and after, for ~3 s
                    response, seconds = await timed("quick", i)
                    if response.status_code == 200:
                        assert response.json()["outputs"][0]["data"] == [i + 2.0]
                    others.append((response.status_code, seconds, response.text))
                    await asyncio.sleep(0.2)
                return await asyncio.gather(*hung), others

        hung, others = asyncio.run(run())
        for response, seconds in hung:
            assert response.status_code == 504, response.text
            assert "ran longer than its timeout (1 s)" in response.json()["error"]
            assert seconds < 4, seconds  # 1 s, plus the check interval, on a busy machine
        # The other model answered all along, never waiting longer than the timeout: a
        # request queued behind a hung call is answered 503 (retry) when its worker is
        # recycled, the others are served.
        statuses = [status for status, _, _ in others]
        assert set(statuses) <= {200, 503}, others
        assert statuses.count(503) <= 2 and statuses[-10:] == [200] * 10, others
        for status, _, text in others:
            assert status == 200 or "ran longer than its timeout" in text, text
        assert max(seconds for _, seconds, _ in others) < 2.5, others
        # Both workers were recycled (not left to the 120 s heartbeat), and came back.
        wait_for(lambda: worker_pids(server).keys() == before.keys(), what="both slots")
        wait_for(lambda: all(worker_pids(server)[s] != before[s] for s in before), what="recycled")
        wait_for(lambda: len(live_workers(server)) == 2, what="two live workers")
        assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
        wait_for(
            lambda: httpx.get(f"{server.url}/v2/health/ready").status_code == 200, what="ready"
        )
        assert len(calls(tmp_path / "sleepy.txt")) == 2
        assert server.stop() == 0


def test_shutdown_with_a_hung_request_keeps_to_its_grace_period(tmp_path: Path) -> None:
    calls_file = tmp_path / "calls.txt"
    write_counting_model(tmp_path / "repo", "stuck", calls_file, delay=600)
    grace = 3.0
    args = ("--workers", "2", "--model-timeout", "0", "--shutdown-timeout", str(grace))
    with Server(tmp_path / "repo", *args) as server:
        server.wait_ready()
        answers: list[int | str] = []

        def hang() -> None:
            try:
                url = f"{server.url}/v2/models/stuck/infer"
                response = httpx.post(url, json=sum_request([[1, 1, 1]], "h"), timeout=60)
                answers.append(response.status_code)
            except httpx.HTTPError as exc:
                answers.append(type(exc).__name__)

        thread = threading.Thread(target=hang, daemon=True)
        thread.start()
        wait_for(lambda: len(calls(calls_file)) == 1, what="the predict running")
        started = time.monotonic()
        code = server.stop(timeout=30)
        took = time.monotonic() - started
        assert code == 0, server.output()
        assert took < grace + 2, took
        thread.join(10)
        assert answers and answers[0] != 200, answers
