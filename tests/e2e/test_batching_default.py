"""Batching on by default where it is safe, on a live server with two workers and in
process: concurrent requests to a built-in runtime's model are joined without changing
any answer, and counted as executions and rows; a custom runtime is batched only when it
says its rows are independent; a bad request is answered alone; ``max_batch_size``
counts rows."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sklearn.linear_model import LogisticRegression

from tests.support import Server, iris_data, write_custom_model, write_sklearn_model

pytestmark = pytest.mark.timeout(300)

# Sums each row, writing the rows of each call to a file. The first call (the calls
# file empty) holds its worker for 0.3 s, long enough that the other concurrent requests
# are all sent and queue behind it even on a loaded machine (in process it holds the
# event loop too); later calls take 10 ms. ``Joining`` says its rows are independent.
RECORDING = """
import os
import time

from inferpool import Runtime


class Recording(Runtime):
    input_errors = (ValueError,)

    def load(self):
        self.calls_file = self.settings.parameters.extra["calls_file"]

    def predict(self, payload, outputs):
        first = not os.path.exists(self.calls_file)
        with open(self.calls_file, "a") as calls:
            calls.write(f"{len(payload)}\\n")
        time.sleep(0.3 if first else 0.01)
        if (payload < 0).any():
            raise ValueError("Input contains negative values.")
        return {outputs[0]: payload.sum(axis=1)}


class Joining(Recording):
    rows_independent = True
"""


NAMES = ("recording", "joining")


def write_recording_model(root: Path, name: str, class_name: str) -> Path:
    calls = root.parent / f"{name}.calls"
    write_custom_model(
        root / name, RECORDING, class_name, module=f"{name}_runtime",
        parameters={"extra": {"calls_file": str(calls)}},
        inputs=[{"name": "x", "datatype": "FP64", "shape": [-1, 3]}],
        outputs=[{"name": "sum", "datatype": "FP64", "shape": [-1]}],
    )  # fmt: skip
    return calls


@pytest.fixture(scope="module", params=["2", "0"], ids=["workers2", "workers0"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    root = tmp_path_factory.mktemp("batching-default") / "repo"
    X, y = iris_data()
    estimator = LogisticRegression(max_iter=1000).fit(X, y)
    write_sklearn_model(root / "iris", estimator)
    capped = write_sklearn_model(root / "iris-capped", estimator)
    (capped / "model-settings.json").write_text('{"max_batch_size": 4}')
    calls = {name: write_recording_model(root, name, name.title()) for name in NAMES}
    with Server(root, "--workers", request.param) as running:
        running.wait_ready()
        running.calls = calls
        yield running


def body(rows: np.ndarray, request_id: str, name: str = "input-0") -> dict:
    tensor = {"name": name, "shape": list(rows.shape), "datatype": "FP64"}
    return {"id": request_id, "inputs": [{**tensor, "data": rows.ravel().tolist()}]}


async def send(server: Server, model: str, bodies: list[dict], clients: int = 64) -> list:
    """Every body posted, ``clients`` at a time; the responses in order."""
    url = f"{server.url}/v2/models/{model}/infer"
    limits = httpx.Limits(max_connections=clients)
    gate = asyncio.Semaphore(clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def post(document: dict) -> httpx.Response:
            async with gate:
                return await client.post(url, json=document)

        return await asyncio.gather(*(post(document) for document in bodies))


def stats(server: Server, model: str) -> dict:
    response = httpx.get(f"{server.url}/v2/models/{model}/stats")
    assert response.status_code == 200, response.text
    return response.json()["model_stats"][0]


def batch_histogram(server: Server, model: str) -> tuple[float, float]:
    """(count, sum) of the model's rows-per-execution histogram on /metrics."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") == model and sample.name.startswith(
                "inferpool_model_batch_size_rows_"
            ):
                found[sample.name.rpartition("_")[2]] = sample.value
    return found.get("count", 0.0), found.get("sum", 0.0)


def recorded(calls: Path) -> list[int]:
    return [int(line) for line in calls.read_text().split()] if calls.exists() else []


def test_concurrent_requests_are_joined_with_the_answers_of_sequential_ones(
    server: Server,
) -> None:
    X, _ = iris_data()
    rng = np.random.default_rng(0)
    bodies = []
    for i in range(480):
        start = int(rng.integers(0, 147))
        bodies.append(body(X[start : start + 1 + i % 3], f"r{i}"))
    rows = sum(len(document["inputs"][0]["data"]) // 4 for document in bodies)
    sequential = [httpx.post(f"{server.url}/v2/models/iris/infer", json=d) for d in bodies[:60]]
    before, histogram_before = stats(server, "iris"), batch_histogram(server, "iris")
    concurrent = asyncio.run(send(server, "iris", bodies))
    after, histogram_after = stats(server, "iris"), batch_histogram(server, "iris")
    assert all(response.status_code == 200 for response in concurrent), concurrent[0].text
    # The labels of a request joined with others are those it gets alone.
    for one, other in zip(sequential, concurrent, strict=False):
        assert one.json() == other.json()
    executions = after["execution_count"] - before["execution_count"]
    assert after["inference_count"] - before["inference_count"] == rows
    requests = after["inference_stats"]["success"]["count"]
    assert requests - before["inference_stats"]["success"]["count"] == len(bodies)
    assert executions < len(bodies), "no two requests were joined"
    joined = [entry for entry in after["batch_stats"] if entry["batch_size"] > 3]
    assert joined and all(entry["compute_infer"]["count"] > 0 for entry in joined)
    # Prometheus: one observation of its rows per execution.
    assert histogram_after[0] - histogram_before[0] == executions
    assert histogram_after[1] - histogram_before[1] == rows


def test_a_custom_runtime_is_batched_only_when_it_opts_in(server: Server) -> None:
    bodies = [body(np.full((1, 3), float(i)), f"r{i}", name="x") for i in range(24)]
    for model in ("recording", "joining"):
        answers = asyncio.run(send(server, model, bodies))
        assert [answer.json()["outputs"][0]["data"] for answer in answers] == [
            [3.0 * i] for i in range(24)
        ]
    assert recorded(server.calls["recording"]) == [1] * 24  # each request alone
    joining = recorded(server.calls["joining"])
    assert sum(joining) == 24 and max(joining) > 1, joining


def test_a_bad_request_among_concurrent_good_ones_gets_its_own_400(server: Server) -> None:
    server.calls["joining"].unlink(missing_ok=True)
    bodies = [body(np.full((2, 3), float(i)), f"r{i}", name="x") for i in range(16)]
    bodies[7] = body(np.full((1, 3), -1.0), "bad", name="x")
    answers = asyncio.run(send(server, "joining", bodies))
    assert [answer.status_code for answer in answers] == [200] * 7 + [400] + [200] * 8
    assert "Input contains negative values." in answers[7].json()["error"]
    for i, answer in enumerate(answers):
        if i != 7:
            assert answer.json()["outputs"][0]["data"] == [3.0 * i] * 2
    # The bad request spoilt a joined predict at most: that one's members ran again alone.
    calls = recorded(server.calls["joining"])
    assert sum(calls) >= 31 and any(call > 2 for call in calls), calls
    # An input the model cannot take at all is refused before it joins anything.
    X, _ = iris_data()
    iris = [body(X[i : i + 1], f"r{i}") for i in range(16)]
    iris[3] = body(X[:1, :3], "narrow")
    answers = asyncio.run(send(server, "iris", iris))
    assert [answer.status_code for answer in answers] == [200] * 3 + [400] + [200] * 12


def test_a_request_larger_than_max_batch_size_runs_alone(server: Server) -> None:
    X, _ = iris_data()
    big = body(X[:10], "big")
    alone = httpx.post(f"{server.url}/v2/models/iris-capped/infer", json=big).json()
    bodies = [body(X[i : i + 1], f"r{i}") for i in range(40)]
    bodies.insert(20, big)
    answers = asyncio.run(send(server, "iris-capped", bodies))
    assert all(answer.status_code == 200 for answer in answers)
    assert answers[20].json() == alone and len(alone["outputs"][0]["data"]) == 10
    sizes = {entry["batch_size"] for entry in stats(server, "iris-capped")["batch_stats"]}
    assert 10 in sizes and sizes - {10} <= {1, 2, 3, 4}, sizes
