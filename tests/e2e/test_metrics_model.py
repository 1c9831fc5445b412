"""Per-model Prometheus metrics on a live server: request counters by protocol and code,
failures by reason class, the request, stage and batch-size histograms (their bucket
bounds from the settings), replicas by state and load time; with and without workers,
over REST and both gRPC implementations."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import Server, build_iris_repository, wait_for_200, write_custom_model
from tests.support.grpc import SETUPS, infer_request, stub_for
from tests.support.runtimes import write_echo_model

BROKEN = """
import inferpool

class Broken(inferpool.Runtime):
    def load(self):
        raise RuntimeError("cannot load")
"""
# Every server of this module: its own batch buckets; the pool's latency buckets too.
BATCH_BUCKETS = "1,3,100"
POOL_LATENCY = "[0.001, 0.01, 0.1, 1, 10]"
DEFAULT_LATENCY = [
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5",
    "1.0", "2.5", "5.0", "10.0", "+Inf",
]  # fmt: skip
IRIS = {"model": "iris-rf", "version": ""}
ROW = [5.1, 3.5, 1.4, 0.2]

Samples = dict[tuple[str, frozenset], float]


# In-process under grpc.aio, and the default: a pool of two under our own gRPC (counting is
# the engine client's, the same for both implementations).
SERVERS = [setup for setup in SETUPS if setup.id in ("grpcio-w0", "builtin-w2")]


@pytest.fixture(scope="module", params=SERVERS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    workers, implementation = request.param
    root = build_iris_repository(tmp_path_factory.mktemp("metrics-model"))
    write_echo_model(root, "echo")
    write_custom_model(root / "broken", BROKEN, "Broken")
    # iris-rf again, batching four requests into one execution (in its one worker).
    batched = root / "iris-batched"
    shutil.copytree(root / "iris-rf", batched)
    settings = {"name": "iris-batched", "max_batch_size": 4, "max_batch_time": 5.0, "replicas": 1}
    (batched / "model-settings.json").write_text(json.dumps(settings))
    env = {"INFERPOOL_METRICS_LATENCY_BUCKETS": POOL_LATENCY} if workers else {}
    flags = ["--workers", str(workers), "--grpc-implementation", implementation]
    flags += ["--no-exit-on-error", "--metrics-batch-buckets", BATCH_BUCKETS]
    with Server(root, *flags, env=env) as server:
        # "broken" keeps the server not ready (strict readiness): wait for the others.
        for model in ("iris-rf", "echo"):
            url = f"{server.url}/v2/models/{model}/ready"
            wait_for_200(url, server.process, server.output, 60, interval=0.05)
        server.workers = workers
        yield server


def scrape(server: Server) -> Samples:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def rest_infer(server: Server, model: str, rows: list, name: str = "x") -> httpx.Response:
    shape = [len(rows), len(rows[0])]
    body = {"inputs": [{"name": name, "shape": shape, "datatype": "FP32", "data": rows}]}
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)


def test_histograms_count_each_request_over_rest(server: Server) -> None:
    before = scrape(server)
    for _ in range(7):
        assert rest_infer(server, "iris-rf", [ROW]).status_code == 200
    after = scrape(server)
    rest = {**IRIS, "protocol": "rest"}
    duration = "inferpool_model_request_duration_seconds"
    assert delta(before, after, "inferpool_model_requests_total", **rest, code="200") == 7
    assert delta(before, after, f"{duration}_count", **rest) == 7
    assert delta(before, after, f"{duration}_bucket", **rest, le="+Inf") == 7
    assert delta(before, after, f"{duration}_sum", **rest) > 0
    for stage in ("queue", "decode", "predict", "encode"):
        name = "inferpool_model_stage_duration_seconds"
        assert delta(before, after, f"{name}_count", **IRIS, stage=stage) == 7
        assert delta(before, after, f"{name}_bucket", **IRIS, stage=stage, le="+Inf") == 7
    assert (
        delta(before, after, "inferpool_model_stage_duration_seconds_sum", **IRIS, stage="predict")
        > 0
    )
    # The Summaries these replace are gone.
    assert not any(name.startswith("inferpool_model_infer_") for name, _ in after)


def test_grpc_requests_are_counted_by_the_code_their_client_got(server: Server) -> None:
    before = scrape(server)
    with stub_for(server) as stub:
        for _ in range(3):
            stub.ModelInfer(infer_request("iris-rf", x=np.array([ROW])))
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(infer_request("iris-rf", x=np.array([[1.0, 2.0]])))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    after = scrape(server)
    grpc_labels = {**IRIS, "protocol": "grpc"}
    assert delta(before, after, "inferpool_model_requests_total", **grpc_labels, code="200") == 3
    assert delta(before, after, "inferpool_model_requests_total", **grpc_labels, code="400") == 1
    name = "inferpool_model_request_duration_seconds_count"
    assert delta(before, after, name, **grpc_labels) == 3
    assert delta(before, after, name, **IRIS, protocol="rest") == 0
    failures = "inferpool_model_failures_total"
    assert delta(before, after, failures, **IRIS, reason="invalid_input") == 1


def test_the_batch_size_histogram_sees_the_rows_of_an_execution(server: Server) -> None:
    before = scrape(server)
    assert rest_infer(server, "iris-rf", [ROW] * 5).status_code == 200
    after = scrape(server)
    name = "inferpool_model_batch_size_rows"
    assert delta(before, after, f"{name}_count", **IRIS) == 1
    assert delta(before, after, f"{name}_sum", **IRIS) == 5
    # The module's buckets (1, 3, 100): five rows are above 3, at most 100.
    bounds = sorted(
        dict(labels)["le"] for name_, labels in after if name_ == f"{name}_bucket"
        and dict(labels)["model"] == "iris-rf"
    )  # fmt: skip
    assert bounds == sorted(["1.0", "3.0", "100.0", "+Inf"])
    assert delta(before, after, f"{name}_bucket", **IRIS, le="3.0") == 0
    assert delta(before, after, f"{name}_bucket", **IRIS, le="100.0") == 1


async def concurrent_rows(server: Server, model: str, requests: int) -> list[int]:
    async with httpx.AsyncClient(timeout=30) as client:
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": ROW}]}
        url = f"{server.url}/v2/models/{model}/infer"
        answers = await asyncio.gather(*(client.post(url, json=body) for _ in range(requests)))
    return [answer.status_code for answer in answers]


def test_a_batched_execution_is_one_observation_of_its_rows(server: Server) -> None:
    before = scrape(server)
    assert asyncio.run(concurrent_rows(server, "iris-batched", 4)) == [200] * 4
    after = scrape(server)
    labels = {"model": "iris-batched", "version": ""}
    name = "inferpool_model_batch_size_rows"
    # The four join into one predict (of four rows at most), in a worker or in process.
    assert delta(before, after, f"{name}_count", **labels) == 1
    assert delta(before, after, f"{name}_sum", **labels) == 4
    requests = "inferpool_model_requests_total"
    assert delta(before, after, requests, **labels, protocol="rest", code="200") == 4


def test_latency_buckets_come_from_the_setting(server: Server) -> None:
    samples = scrape(server)
    bounds = [
        dict(labels)["le"]
        for name, labels in samples
        if name == "inferpool_model_request_duration_seconds_bucket"
        and dict(labels)["model"] == "iris-rf" and dict(labels)["protocol"] == "rest"
    ]  # fmt: skip
    expected = (
        ["0.001", "0.01", "0.1", "1.0", "10.0", "+Inf"] if server.workers else DEFAULT_LATENCY
    )
    assert sorted(bounds) == sorted(expected)


def test_codes_and_failure_reasons(server: Server) -> None:
    before = scrape(server)
    assert rest_infer(server, "echo", [[1.0]], name="fail").status_code == 500
    assert rest_infer(server, "iris-rf", [[1.0, 2.0]]).status_code == 400
    assert rest_infer(server, "broken", [ROW]).status_code == 503
    assert rest_infer(server, "no-such-model", [ROW]).status_code == 404
    after = scrape(server)
    requests, failures = "inferpool_model_requests_total", "inferpool_model_failures_total"
    echo = {"model": "echo", "version": ""}
    broken = {"model": "broken", "version": ""}
    assert delta(before, after, requests, **echo, protocol="rest", code="500") == 1
    assert delta(before, after, failures, **echo, reason="model_error") == 1
    assert delta(before, after, requests, **IRIS, protocol="rest", code="400") == 1
    assert delta(before, after, failures, **IRIS, reason="invalid_input") == 1
    assert delta(before, after, requests, **broken, protocol="rest", code="503") == 1
    assert delta(before, after, failures, **broken, reason="unavailable") == 1
    # Every reason class has its series (0 until it happens); a 404 has no model to count.
    reasons = {dict(labels)["reason"] for name, labels in after if name == failures}
    assert reasons == {
        "invalid_input", "model_error", "timeout", "overloaded", "unavailable",
        "worker_lost", "cancelled", "internal", "rate_limited",
    }  # fmt: skip
    assert not any(dict(labels).get("model") == "no-such-model" for _, labels in after)
    assert value(after, failures, **echo, reason="internal") == 0


def test_a_request_past_its_deadline_is_a_timeout(server: Server) -> None:
    if not server.workers:
        pytest.skip("in-process a request runs on the event loop: nothing interrupts it")
    before = scrape(server)
    body = {"inputs": [{"name": "sleep", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    url = f"{server.url}/v2/models/echo/infer"
    answer = httpx.post(url, json=body, headers={"Request-Timeout": "0.2"}, timeout=30)
    assert answer.status_code == 504
    after = scrape(server)
    echo = {"model": "echo", "version": ""}
    requests = "inferpool_model_requests_total"
    assert delta(before, after, requests, **echo, protocol="rest", code="504") == 1
    assert delta(before, after, "inferpool_model_failures_total", **echo, reason="timeout") == 1


def test_replicas_by_state_and_load_duration(server: Server) -> None:
    samples = scrape(server)
    replicas = "inferpool_model_replicas"
    expected = server.workers or 1  # a replica on each worker; in-process one per version
    assert value(samples, replicas, **IRIS, state="ready") == expected
    assert value(samples, replicas, **IRIS, state="loading") == 0
    broken = {"model": "broken", "version": ""}
    assert value(samples, replicas, **broken, state="failed") == expected
    assert value(samples, replicas, **broken, state="ready") == 0
    load = "inferpool_model_load_duration_seconds"
    assert 0 < value(samples, load, **IRIS) < 60
    assert 0 < value(samples, load, **broken) < 60


@pytest.mark.parametrize(
    ("how", "bad", "message"),
    [
        ("flag", "0.5,0.1", "bucket bounds must increase"),
        ("env", "[1, Infinity]", "bucket bounds must be positive and finite"),
    ],
)
def test_a_bad_bucket_setting_is_refused(tmp_path: Path, how: str, bad: str, message: str) -> None:
    command = [sys.executable, "-m", "inferpool", "serve", str(tmp_path), "--workers", "0"]
    env = None
    if how == "flag":
        command += ["--metrics-batch-buckets", bad]
    else:
        env = {**os.environ, "INFERPOOL_METRICS_LATENCY_BUCKETS": bad}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert "invalid settings" in result.stderr and message in result.stderr
