"""``--workers 2``: many concurrent requests, big payloads and a clean shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import joblib
import numpy as np
import orjson
import pytest

from tests.support import Server, build_iris_repository, iris_data
from tests.support.pool import shm_listing, worker_pids

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_iris_repository(tmp_path_factory.mktemp("pool-iris"))


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[Server]:
    shm_before = shm_listing()
    with Server(repo, "--workers", "2") as running:
        running.wait_ready()
        assert shm_listing() == shm_before  # rings are memfds, never /dev/shm names
        yield running


def estimator(repo: Path, name: str):
    return joblib.load(repo / name / "model.joblib")


def v2_body(rows: np.ndarray, request_id: str | None = None) -> dict:
    body = {"inputs": [{"name": "x", "shape": list(rows.shape), "datatype": "FP64",
                        "data": rows.ravel().tolist()}]}  # fmt: skip
    if request_id is not None:
        body["id"] = request_id
    return body


def test_two_workers_serve(server: Server) -> None:
    assert len(worker_pids(server)) == 2
    response = httpx.get(f"{server.url}/v2/models/iris-logreg/ready")
    assert response.status_code == 200


def test_500_concurrent_requests_across_two_models(server: Server, repo: Path) -> None:
    X, _ = iris_data()
    rng = np.random.default_rng(0)
    models = {name: estimator(repo, name) for name in ("iris-logreg", "iris-rf")}
    plan = []
    for i in range(500):
        name = ("iris-logreg", "iris-rf")[i % 2]
        rows = X[rng.choice(len(X), size=int(rng.integers(1, 6)))]
        plan.append((name, f"req-{i}", rows))

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(f"{server.url}/v2/models/{name}/infer", json=v2_body(rows, rid))
                    for name, rid, rows in plan
                )
            )

    responses = asyncio.run(run())
    for (name, request_id, rows), response in zip(plan, responses, strict=True):
        assert response.status_code == 200, response.text
        document = response.json()
        assert document["id"] == request_id
        assert document["model_name"] == name
        assert document["outputs"][0]["data"] == models[name].predict(rows).tolist()


def test_50_mb_binary_payload(server: Server, repo: Path) -> None:
    rows = np.random.default_rng(1).uniform(0, 8, size=(1_650_000, 4))
    raw = rows.astype("<f8").tobytes()
    assert len(raw) >= 50 * 1000 * 1000
    header = orjson.dumps(
        {
            "inputs": [
                {"name": "x", "shape": list(rows.shape), "datatype": "FP64",
                 "parameters": {"binary_data_size": len(raw)}}
            ]
        }
    )  # fmt: skip
    response = httpx.post(
        f"{server.url}/v2/models/iris-logreg/infer",
        content=header + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=120,
    )
    assert response.status_code == 200, response.text[:500]
    output = response.json()["outputs"][0]
    assert output["shape"] == [len(rows)]
    expected = estimator(repo, "iris-logreg").predict(rows)
    assert np.array_equal(np.asarray(output["data"]), expected)


def test_20_mb_json_payload(server: Server, repo: Path) -> None:
    rows = np.random.default_rng(2).uniform(0, 8, size=(300_000, 4))
    body = orjson.dumps(v2_body(rows, "big-json"))
    assert len(body) >= 20 * 1000 * 1000
    response = httpx.post(
        f"{server.url}/v2/models/iris-rf/infer",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    assert response.status_code == 200, response.text[:500]
    document = response.json()
    assert document["id"] == "big-json"
    expected = estimator(repo, "iris-rf").predict(rows)
    assert np.array_equal(np.asarray(document["outputs"][0]["data"]), expected)


def test_worker_errors_come_back_as_json(server: Server) -> None:
    bad = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, 3]}]}
    response = httpx.post(f"{server.url}/v2/models/iris-logreg/infer", json=bad)
    assert response.status_code == 400
    assert "expects 4 features" in response.json()["error"]
    response = httpx.post(f"{server.url}/v2/models/iris-logreg/infer", content=b"{not json")
    assert response.status_code == 400
    assert "error" in response.json()


def test_stats_show_the_worker_stages(server: Server) -> None:
    X, _ = iris_data()
    for _ in range(3):
        httpx.post(f"{server.url}/v2/models/iris-logreg/infer", json=v2_body(X[:2]))
    stats = httpx.get(f"{server.url}/v2/models/iris-logreg/stats").json()["model_stats"][0]
    inference = stats["inference_stats"]
    assert inference["success"]["count"] >= 3
    for stage in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[stage]["count"] >= 3
        assert inference[stage]["ns"] > 0


def test_shutdown_leaves_nothing_behind(repo: Path) -> None:
    before = shm_listing()
    X, _ = iris_data()
    server = Server(repo, "--workers", "2")
    try:
        server.wait_ready()
        pids = list(worker_pids(server).values())
        big = np.tile(X, (2000, 1))  # a payload bigger than a ring slot
        response = httpx.post(
            f"{server.url}/v2/models/iris-rf/infer", json=v2_body(big), timeout=60
        )
        assert response.status_code == 200
    finally:
        code = server.stop()
        server.log.close()
    assert code == 0
    assert shm_listing() == before
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
