"""Adaptive batching in the workers: same answers as unbatched, fewer runtime calls."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support import Server
from tests.support.pool import calls, sum_request, write_counting_model

pytestmark = pytest.mark.timeout(300)


def test_batching_matches_unbatched_with_fewer_calls(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    batched_calls, plain_calls = tmp_path / "batched.txt", tmp_path / "plain.txt"
    # One replica each, so every request of a model queues in the same worker.
    write_counting_model(
        repo, "batched", batched_calls, delay=0.05, replicas=1,
        max_batch_size=16, max_batch_time=0.2,
    )  # fmt: skip
    write_counting_model(repo, "plain", plain_calls, delay=0.05, replicas=1)
    rng = np.random.default_rng(3)
    requests = []
    for i in range(40):
        rows = rng.integers(0, 100, size=(int(rng.integers(1, 4)), 3)).astype(float)
        requests.append(sum_request(rows.tolist(), f"req-{i}"))
    # A request with another row width cannot join a batch: it is predicted on its own.
    requests.append(sum_request([[1.0, 2.0]], "narrow"))
    requests[-1]["inputs"][0]["shape"] = [1, 2]

    async def send_all(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(url, json=body) for body in requests))

    with Server(repo, "--workers", "2") as server:
        server.wait_ready()
        batched = asyncio.run(send_all(f"{server.url}/v2/models/batched/infer"))
        plain = asyncio.run(send_all(f"{server.url}/v2/models/plain/infer"))
    for body, one, other in zip(requests, batched, plain, strict=True):
        assert one.status_code == other.status_code == 200, (one.text, other.text)
        assert one.json()["id"] == other.json()["id"] == body["id"]
        expected = np.asarray(body["inputs"][0]["data"]).sum(axis=1).tolist()
        assert one.json()["outputs"][0]["data"] == expected
        assert other.json()["outputs"][0]["data"] == expected
        assert one.json()["outputs"][0]["shape"] == [len(expected)]
    total_rows = sum(len(body["inputs"][0]["data"]) for body in requests)
    plain_log, batched_log = calls(plain_calls), calls(batched_calls)
    assert len(plain_log) == len(requests)
    assert sum(rows for _, rows in batched_log) == total_rows
    assert len(batched_log) <= 20, batched_log  # 41 requests, batches of up to 16
    assert max(rows for _, rows in batched_log) > 3  # some call really took a batch
