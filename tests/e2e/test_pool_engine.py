"""``inferpool.Engine(repo, workers=2)``: the embedded API over the same worker pool."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import joblib
import numpy as np
import orjson
import pytest

from inferpool import Engine, InferenceResult
from tests.support import build_iris_repository, iris_data

pytestmark = pytest.mark.timeout(180)


def request_for(rows: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(rows.shape), "datatype": "FP64",
                        "data": rows.ravel().tolist()}]}  # fmt: skip


def test_engine_with_workers_sync_and_async(tmp_path: Path) -> None:
    repo = build_iris_repository(tmp_path)
    X, _ = iris_data()
    expected = joblib.load(repo / "iris-rf" / "model.joblib").predict(X[:10]).tolist()
    with Engine(repo, workers=2) as engine:
        client = engine.client
        assert type(client).__name__ == "PoolClient"
        assert len([w for w in client.workers if w.alive]) == 2
        answer = engine.infer_sync("iris-rf", request_for(X[:10]))
        assert answer["predict"].tolist() == expected
        zygote = client.supervisor.template.process
    assert zygote.poll() is not None  # the template (and so every worker) is gone
    assert all(not w.alive for w in client.workers)

    async def use_async() -> list[InferenceResult]:
        async with Engine(repo, workers=2) as engine:
            return await asyncio.gather(
                *(engine.infer("iris-rf", request_for(X[i : i + 10])) for i in (0, 0, 0))
            )

    for answer in asyncio.run(use_async()):
        assert answer["predict"].tolist() == expected


def test_deadlines_and_custom_endpoints_cross_the_pool(tmp_path: Path) -> None:
    from inferpool.engine.ipc.messages import Kind
    from inferpool.engine.pool.pool import PoolClient
    from inferpool.protocol.endpoints import call_body, read_answer
    from inferpool.settings import ServerSettings
    from tests.support.pool import sum_request, write_counting_model

    write_counting_model(tmp_path, "slow", tmp_path / "calls.txt", delay=0.5, replicas=1)
    body = orjson.dumps(sum_request([[1, 2, 3]], "d"))

    async def run() -> None:
        client = PoolClient(ServerSettings(model_repository=tmp_path, workers=2))
        try:
            [status] = await client.start()
            assert status.state.value == "READY"
            first = asyncio.ensure_future(client.infer("slow", None, Kind.REST, body, None))
            await asyncio.sleep(0.1)
            # Queued behind a 0.5 s predict, it is dropped before it reaches the model.
            late = await client.infer(
                "slow", None, Kind.REST, body, None, deadline=time.monotonic() + 0.2
            )
            assert late.status == 504
            assert (await first).status == 200
            # A caller that goes away before its request starts costs no predict.
            first = asyncio.ensure_future(client.infer("slow", None, Kind.REST, body, None))
            await asyncio.sleep(0.1)
            gone = asyncio.ensure_future(client.infer("slow", None, Kind.REST, body, None))
            await asyncio.sleep(0.1)
            gone.cancel()
            assert (await first).status == 200
            for _ in range(200):  # its slot is freed once the worker confirms the drop
                if not any(w.inflight for w in client.workers):
                    break
                await asyncio.sleep(0.01)
            assert not any(w.inflight for w in client.workers)
            reply = await client.infer("slow", None, Kind.CUSTOM, call_body("whoami", b"abc"), None)
            assert reply.status == 200
            answer = orjson.loads(read_answer(reply.body, reply.json_length)[1])
            assert answer["bytes"] == 3
            assert answer["pid"] in {w.pid for w in client.workers}
            assert client.live
        finally:
            await client.close()
        assert not client.live

    asyncio.run(run())
    assert len((tmp_path / "calls.txt").read_text().splitlines()) == 2
