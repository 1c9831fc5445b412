"""Triton's statistics definitions end to end: inference_count counts rows, execution_count
counts model executions (a batch of requests predicted together is one), and batch_stats
lists the executions per batch size, over REST, gRPC and tritonclient, in-process and with
workers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from sklearn.linear_model import LogisticRegression

from tests.support import Server, build_iris_repository, iris_data, write_sklearn_model

MODEL = "iris-logreg"
BATCHED = "iris-batched"


def v2_body(rows: np.ndarray) -> dict:
    return {
        "inputs": [
            {
                "name": "input-0",
                "shape": list(rows.shape),
                "datatype": "FP64",
                "data": rows.ravel().tolist(),
            }
        ]
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_iris_repository(tmp_path_factory.mktemp("triton-stats"))
    X, y = iris_data()
    folder = write_sklearn_model(root / BATCHED, LogisticRegression(max_iter=1000).fit(X, y))
    # Up to 16 rows per execution, a long wait so that concurrent requests meet, and
    # one replica so that they all reach the same worker.
    settings = {"name": BATCHED, "max_batch_size": 16, "max_batch_time": 0.5, "replicas": 1}
    (folder / "model-settings.json").write_text(json.dumps(settings))
    return root


@pytest.fixture(scope="module", params=["0", "2"], ids=["workers0", "workers2"])
def server(repository: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    with Server(repository, "--workers", request.param) as running:
        running.wait_ready()
        yield running


def rest_stats(server: Server, model: str) -> dict:
    response = httpx.get(f"{server.url}/v2/models/{model}/stats")
    assert response.status_code == 200
    return response.json()["model_stats"][0]


def test_rows_and_requests_are_counted_apart(server: Server) -> None:
    X, _ = iris_data()
    before = rest_stats(server, MODEL)
    for rows in (X[:3], X[3:5]):
        response = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=v2_body(rows))
        assert response.status_code == 200
    after = rest_stats(server, MODEL)
    assert after["inference_count"] - before["inference_count"] == 5
    assert after["execution_count"] - before["execution_count"] == 2
    success = after["inference_stats"]["success"]["count"]
    assert success - before["inference_stats"]["success"]["count"] == 2
    # Each request ran alone: executions of 3 rows and of 2 rows.
    sizes = {entry["batch_size"]: entry for entry in after["batch_stats"]}
    assert {2, 3} <= set(sizes)
    for stage in ("compute_input", "compute_infer", "compute_output"):
        assert sizes[3][stage]["count"] >= 1
        assert sizes[3][stage]["ns"] > 0


def test_grpc_statistics_match_rest(server: Server) -> None:
    X, _ = iris_data()
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    before = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    tensor = triton_grpc.InferInput("input-0", [4, 4], "FP64")
    tensor.set_data_from_numpy(X[:4])
    client.infer(MODEL, [tensor])
    after = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    # as_json writes uint64 as strings (protobuf's JSON mapping).
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 4
    assert int(after["execution_count"]) - int(before.get("execution_count", 0)) == 1
    sizes = {int(entry["batch_size"]): entry for entry in after["batch_stats"]}
    assert int(sizes[4]["compute_infer"]["count"]) >= 1
    rest = rest_stats(server, MODEL)
    assert int(after["inference_count"]) == rest["inference_count"]
    assert int(after["execution_count"]) == rest["execution_count"]
    assert len(after["batch_stats"]) == len(rest["batch_stats"])
    client.close()


def test_concurrent_requests_count_one_execution(server: Server) -> None:
    X, _ = iris_data()
    before = rest_stats(server, BATCHED)
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"), concurrency=4)
    # Four requests of 1, 2, 3 and 4 rows sent at once: they meet in one predict of 10
    # rows (of 16 at most), in the worker or in process.
    pending = []
    for rows in (1, 2, 3, 4):
        tensor = triton_http.InferInput("input-0", [rows, 4], "FP64")
        tensor.set_data_from_numpy(X[:rows], binary_data=True)
        pending.append(client.async_infer(BATCHED, [tensor]))
    for call in pending:
        call.get_result()
    client.close()
    after = rest_stats(server, BATCHED)
    assert after["inference_count"] - before["inference_count"] == 10
    assert after["execution_count"] - before["execution_count"] == 1
    assert (
        after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
        == 4
    )
    sizes = {entry["batch_size"]: entry for entry in after["batch_stats"]}
    assert sizes[10]["compute_infer"]["count"] == 1
    assert sizes[10]["compute_input"]["ns"] > 0


def test_failed_requests_count_no_inference(server: Server) -> None:
    before = rest_stats(server, MODEL)
    bad = {"inputs": [{"name": "input-0", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, 3]}]}
    response = httpx.post(f"{server.url}/v2/models/{MODEL}/infer", json=bad)
    assert response.status_code == 400
    after = rest_stats(server, MODEL)
    assert after["inference_count"] == before["inference_count"]
    assert after["execution_count"] == before["execution_count"]
    assert (
        after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"] + 1
    )
