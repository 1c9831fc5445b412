"""Every path through the pool frees what it took: in-flight entries, ring slots, memfds.

A header value the slot header cannot carry used to be registered in the worker's
in-flight map before packing failed, leaking a queue slot for good (after ``max_queue``
of them every request answered 503). Here each kind of request goes through the pool
many times, good and bad, small (ring) and big (memfd), answered, cancelled and failed,
and afterwards nothing is left: no in-flight entry, no pending ring slot, no queued
control message, no extra file descriptor; and a normal request still answers.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import orjson
import pytest

from inferpool.engine.ipc.messages import Kind
from inferpool.engine.pool.handles import SLOT_SIZE
from inferpool.engine.pool.pool import PoolClient
from inferpool.errors import BadRequest
from inferpool.settings import ServerSettings
from tests.support.pool import sum_request, write_counting_model

pytestmark = pytest.mark.timeout(180)

QUEUE = 4  # per worker: a single leaked slot per request would exhaust it at once
ROUNDS = 3 * QUEUE


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def assert_drained(client: PoolClient) -> None:
    for worker in client.supervisor.alive():
        assert worker.inflight == {}, worker.describe()
        assert worker.requests.pending() == 0, worker.describe()
        assert worker.replies.pending() == 0, worker.describe()
        assert not worker.outbox, worker.describe()


async def settle(client: PoolClient) -> None:
    """Wait (bounded) until the workers have answered or dropped what they were sent."""
    for _ in range(300):
        if not any(w.inflight or w.requests.pending() for w in client.supervisor.alive()):
            return
        await asyncio.sleep(0.01)


def test_every_path_frees_its_slot(tmp_path: Path) -> None:
    write_counting_model(tmp_path, "sum", tmp_path / "calls.txt")
    write_counting_model(tmp_path, "slow", tmp_path / "slow.txt", delay=0.3)
    small = orjson.dumps(sum_request([[1, 2, 3]], "small"))
    rows = [[float(i), 1.0, 1.0] for i in range(16000)]
    big = orjson.dumps(sum_request(rows, "big"))  # > one slot: its own memfd
    assert len(big) > SLOT_SIZE

    async def run() -> None:
        settings = ServerSettings(model_repository=tmp_path, workers=2, max_queue=QUEUE)
        client = PoolClient(settings)
        try:
            statuses = await client.start()
            assert {s.state.value for s in statuses} == {"READY"}
            baseline = open_fds()
            far = time.monotonic() + 2562047 * 3600  # grpc-go's largest deadline
            bad = [
                # (json_length, deadline): none of these fits the slot header
                (2**63, None),  # Inference-Header-Content-Length > int64
                (2**64 + 5, None),
                (-7, None),  # negative
                (10**6, None),  # longer than the body
                (None, float("inf")),
                (None, float("nan")),
            ]
            for _ in range(ROUNDS):
                for body in (small, big):
                    for json_length, deadline in bad:
                        with pytest.raises(BadRequest) as caught:
                            await client.infer("sum", None, Kind.REST, body, json_length, deadline)
                        message = caught.value.message
                        assert "out of range" in message, message
                        what = "Content-Length" if json_length is not None else "deadline"
                        assert what in message, message
                    # A deadline centuries away is no deadline: served.
                    reply = await client.infer("sum", None, Kind.REST, body, None, far)
                    assert reply.status == 200, reply.body
                    reply = await client.infer("sum", None, Kind.REST, body, len(body))
                    assert reply.status == 200, reply.body
            # Cancelled callers (queued behind a slow predict) free their slots too.
            for _ in range(3):
                slow = [
                    asyncio.ensure_future(client.infer("slow", None, Kind.REST, body, None))
                    for body in (small, big, small, big)
                ]
                await asyncio.sleep(0.05)
                for task in slow[1:]:
                    task.cancel()
                assert (await slow[0]).status == 200
                await asyncio.gather(*slow[1:], return_exceptions=True)
            await settle(client)
            assert_drained(client)
            assert open_fds() <= baseline  # no memfd or doorbell left behind
            reply = await client.infer("sum", None, Kind.REST, small, None)
            assert reply.status == 200
            assert orjson.loads(reply.body)["outputs"][0]["data"] == [6.0]
        finally:
            await client.close()

    asyncio.run(run())


def test_a_dead_workers_slots_are_freed(tmp_path: Path) -> None:
    """Requests held by a worker that dies are answered 503 and leave nothing behind."""
    write_counting_model(tmp_path, "slow", tmp_path / "calls.txt", delay=0.3)
    body = orjson.dumps(sum_request([[1, 2, 3]], "r"))

    async def run() -> None:
        settings = ServerSettings(model_repository=tmp_path, workers=2, max_queue=QUEUE)
        client = PoolClient(settings)
        try:
            await client.start()
            for _ in range(2):  # a third crash in 60 s would quarantine the model
                tasks = [
                    asyncio.ensure_future(client.infer("slow", None, Kind.REST, body, None))
                    for _ in range(2 * QUEUE)
                ]
                await asyncio.sleep(0.1)
                victim = client.workers[0]
                os.kill(victim.pid, 9)
                replies = await asyncio.gather(*tasks)
                assert {r.status for r in replies} <= {200, 503}
                assert any(r.status == 503 for r in replies)
                for _ in range(200):  # the replacement is back with its replica
                    if len(client.routes["slow"].ready) == 2:
                        break
                    await asyncio.sleep(0.05)
                assert len(client.routes["slow"].ready) == 2
            await settle(client)
            assert_drained(client)
            assert client.live
            reply = await client.infer("slow", None, Kind.REST, body, None)
            assert reply.status == 200
        finally:
            await client.close()

    asyncio.run(run())


def test_lying_header_values_over_rest_leak_no_slot(tmp_path: Path) -> None:
    """Through the real frontend: each is a 400, and the 2-slot queues never fill."""
    import httpx

    from tests.support import Server

    write_counting_model(tmp_path / "repo", "sum", tmp_path / "calls.txt")
    good = sum_request([[1, 2, 3]], "good")
    with Server(tmp_path / "repo", "--workers", "2", "--max-queue", "2") as server:
        server.wait_ready()
        url = f"{server.url}/v2/models/sum/infer"
        body = orjson.dumps(good)
        for value in ("99999999999999999999", str(2**63), "-5", str(len(body) + 1)) * 5:
            response = httpx.post(
                url, content=body, headers={"Inference-Header-Content-Length": value}
            )
            assert response.status_code == 400, (value, response.text)
            assert "Inference-Header-Content-Length" in response.json()["error"]
        for _ in range(5):
            response = httpx.post(url, json=good)
            assert response.status_code == 200, response.text
            assert response.json()["outputs"][0]["data"] == [6.0]
