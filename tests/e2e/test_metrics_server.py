"""Server, worker and process metrics on a live server (docs/operate/metrics.md).

Two servers for the module: two workers (builtin gRPC, a metrics port), and none with
``--metrics-port 0`` (its /metrics on the REST port) and grpcio. Killing a worker is the
last test of the two-worker server, so the other tests see it undisturbed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.support import Server, build_iris_repository
from tests.support.h2client import RawConnection
from tests.support.h2frames import PING, PROTOCOL_ERROR, frame, goaway
from tests.support.pool import wait_for, worker_pids
from tests.support.runtimes import write_echo_model

MAX_BODY = 65_536
HEARTBEAT_TIMEOUT = 4.0  # pings every second


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    text = httpx.get(url, timeout=10).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def labelled(samples: Samples, name: str, label: str) -> dict[str, float]:
    """``label``'s value -> sample value, for every sample of ``name``."""
    return {
        dict(labels)[label]: found for (sample, labels), found in samples.items() if sample == name
    }


def start(repository: Path, *args: str) -> Server:
    server = Server(repository, *args)
    try:
        server.wait_ready()
    except BaseException:
        server.__exit__(None, None, None)
        raise
    return server


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_iris_repository(tmp_path_factory.mktemp("repo"))
    write_echo_model(root, "slow")  # its input "sleep": seconds each predict sleeps
    return root


@pytest.fixture(scope="module")
def pool(repository: Path) -> Iterator[Server]:
    with start(
        repository,
        "--workers", "2",
        "--max-queue", "1",  # one request per worker: a third at once is overload
        "--max-body-bytes", str(MAX_BODY),
        "--worker-heartbeat-timeout", str(HEARTBEAT_TIMEOUT),
    ) as server:  # fmt: skip
        yield server


@pytest.fixture(scope="module")
def inprocess(repository: Path) -> Iterator[Server]:
    with start(
        repository, "--workers", "0", "--metrics-port", "0", "--grpc-implementation", "grpcio"
    ) as server:
        server.metrics_port = 0
        yield server


def metrics_url(server: Server) -> str:
    if server.metrics_port == 0:  # on the REST port
        return server.url + "/metrics"
    return f"http://127.0.0.1:{server.metrics_port}/metrics"


@pytest.mark.parametrize("name", ["pool", "inprocess"])
def test_build_info_and_the_process_tree(name: str, request: pytest.FixtureRequest) -> None:
    server = request.getfixturevalue(name)
    samples = scrape(metrics_url(server))
    (info,) = [labels for (sample, labels) in samples if sample == "inferpool_build_info"]
    info_labels = dict(info)
    assert info_labels["implementation"] == "CPython"
    assert info_labels["python"].startswith("3.")
    assert info_labels["version"]
    cpu = labelled(samples, "inferpool_process_cpu_seconds_total", "process")
    rss = labelled(samples, "inferpool_process_resident_memory_bytes", "process")
    tree = {"server", "template", "worker-0", "worker-1"} if name == "pool" else {"server"}
    assert set(cpu) == set(rss) == tree
    assert cpu["server"] > 0 and all(found >= 0 for found in cpu.values())
    assert all(found > 1_000_000 for found in rss.values())


def test_worker_heartbeat_age_and_memory(pool: Server) -> None:
    samples = scrape(metrics_url(pool))
    age = labelled(samples, "inferpool_worker_heartbeat_age_seconds", "worker")
    rss = labelled(samples, "inferpool_worker_resident_memory_bytes", "worker")
    pss = labelled(samples, "inferpool_worker_proportional_memory_bytes", "worker")
    assert set(age) == set(rss) == set(pss) == {"0", "1"}
    assert all(0 <= seconds < HEARTBEAT_TIMEOUT for seconds in age.values())
    for worker in ("0", "1"):
        # Pages shared with the template and the other worker count in shares in the PSS.
        assert 0 < pss[worker] <= rss[worker]
    restarts = labelled(samples, "inferpool_worker_restarts_total", "worker")
    assert restarts == {"0": 0, "1": 0}
    assert value(samples, "inferpool_template_restarts_total") == 0


def test_no_worker_metrics_without_workers(inprocess: Server) -> None:
    names = {sample for sample, _ in scrape(metrics_url(inprocess))}
    assert not any(name.startswith("inferpool_worker_") for name in names)
    assert "inferpool_template_restarts_total" not in names
    assert "inferpool_open_connections" in names


def open_connections(url: str) -> dict[str, float]:
    return labelled(scrape(url), "inferpool_open_connections", "frontend")


def idle_keep_alive(port: int) -> socket.socket:
    """A connection that has been answered once and stays open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    return sock


@pytest.mark.parametrize("name", ["pool", "inprocess"])
def test_open_connections_count_http1_and_grpc(name: str, request: pytest.FixtureRequest) -> None:
    server = request.getfixturevalue(name)
    url = metrics_url(server)
    # Idle but for the scrape's own connection: the metrics port's, or the REST port's.
    idle = {"rest": 0, "grpc": 0, "metrics": 1} if name == "pool" else {"rest": 1, "grpc": 0}
    wait_for(lambda: open_connections(url) == idle, what="no connection but the scrape's")
    sock = idle_keep_alive(server.http_port)
    channel = grpc.insecure_channel(server.grpc_address)
    try:
        grpc.channel_ready_future(channel).result(timeout=10)
        both = {**idle, "rest": idle["rest"] + 1, "grpc": 1}
        wait_for(lambda: open_connections(url) == both, what="both connections counted")
    finally:
        sock.close()
        channel.close()
    wait_for(lambda: open_connections(url) == idle, what="the connections closed")


def rejected(server: Server, frontend: str, reason: str) -> float:
    samples = scrape(metrics_url(server))
    return (
        value(samples, "inferpool_rejected_requests_total", frontend=frontend, reason=reason) or 0
    )


def test_a_body_over_the_limit_is_counted_by_its_setting(pool: Server) -> None:
    rest_before = rejected(pool, "rest", "max_body_bytes")
    grpc_before = rejected(pool, "grpc", "max_body_bytes")
    response = httpx.post(
        pool.url + "/v2/models/iris-logreg/infer", content=b"x" * (MAX_BODY + 1), timeout=10
    )
    assert response.status_code == 413
    with grpc.insecure_channel(pool.grpc_address) as channel:
        too_large = [b"x" * MAX_BODY]
        request = pb.ModelInferRequest(model_name="iris-logreg", raw_input_contents=too_large)
        with pytest.raises(grpc.RpcError) as failed:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert failed.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert rejected(pool, "rest", "max_body_bytes") == rest_before + 1
    assert rejected(pool, "grpc", "max_body_bytes") == grpc_before + 1
    assert rejected(pool, "rest", "overload") == 0  # present from the start


def test_too_many_headers_are_counted_by_their_setting(pool: Server) -> None:
    rest_before = rejected(pool, "rest", "max_header_count")
    grpc_before = rejected(pool, "grpc", "max_header_count")
    headers = [(f"x-extra-{i}", "1") for i in range(101)]  # max_header_count: 100
    response = httpx.get(pool.url + "/v2/health/live", headers=headers, timeout=10)
    assert response.status_code == 431
    with (
        grpc.insecure_channel(pool.grpc_address) as channel,
        pytest.raises(grpc.RpcError) as failed,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        stub.ServerLive(pb.ServerLiveRequest(), metadata=headers, timeout=10)
    assert failed.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert rejected(pool, "rest", "max_header_count") == rest_before + 1
    assert rejected(pool, "grpc", "max_header_count") == grpc_before + 1


def test_overload_is_counted_per_frontend(pool: Server) -> None:
    rest_before = rejected(pool, "rest", "overload")
    grpc_before = rejected(pool, "grpc", "overload")
    body = {"inputs": [{"name": "sleep", "shape": [1], "datatype": "FP32", "data": [0.5]}]}

    async def post_all() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:
            url = pool.url + "/v2/models/slow/infer"
            replies = await asyncio.gather(*(client.post(url, json=body) for _ in range(6)))
        return [reply.status_code for reply in replies]

    statuses = asyncio.run(post_all())
    assert 503 in statuses and 200 in statuses
    half_a_second = pb.InferTensorContents(fp32_contents=[0.5])
    sleep = pb.ModelInferRequest.InferInputTensor(
        name="sleep", datatype="FP32", shape=[1], contents=half_a_second
    )
    request = pb.ModelInferRequest(model_name="slow", inputs=[sleep])
    with grpc.insecure_channel(pool.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        calls = [stub.ModelInfer.future(request, timeout=30) for _ in range(6)]
        codes = [call.code() for call in calls]
    assert grpc.StatusCode.UNAVAILABLE in codes and grpc.StatusCode.OK in codes
    assert rejected(pool, "rest", "overload") == rest_before + statuses.count(503)
    assert rejected(pool, "grpc", "overload") == grpc_before + codes.count(
        grpc.StatusCode.UNAVAILABLE
    )


def test_a_bad_frame_is_counted_as_a_goaway_by_its_code(pool: Server) -> None:
    name = "inferpool_http2_goaways_sent_total"
    before = value(scrape(metrics_url(pool)), name, frontend="grpc", code="PROTOCOL_ERROR") or 0
    with RawConnection(pool.grpc_port) as connection:
        connection.send(frame(PING, 0, 1, b"\0" * 8))  # PING on a stream
        assert goaway(connection.read_until_closed())[1] == PROTOCOL_ERROR
    samples = scrape(metrics_url(pool))
    assert value(samples, name, frontend="grpc", code="PROTOCOL_ERROR") == before + 1


def test_metrics_on_the_rest_port_only_when_the_metrics_port_is_0(
    pool: Server, inprocess: Server
) -> None:
    samples = scrape(inprocess.url + "/metrics")
    assert value(samples, "inferpool_model_ready", model="iris-logreg", version="") == 1
    assert any(sample == "inferpool_build_info" for sample, _ in samples)
    assert httpx.get(pool.url + "/metrics").status_code == 404


def test_killing_a_worker_counts_a_restart_of_its_slot(pool: Server) -> None:
    victim = worker_pids(pool)[0]
    os.kill(victim, signal.SIGKILL)

    def restarted() -> bool:
        samples = scrape(metrics_url(pool))
        restarts = labelled(samples, "inferpool_worker_restarts_total", "worker")
        return restarts == {"0": 1, "1": 0}

    wait_for(restarted, what="worker 0's restart counted")
    samples = scrape(metrics_url(pool))
    processes = labelled(samples, "inferpool_process_cpu_seconds_total", "process")
    assert set(processes) == {"server", "template", "worker-0", "worker-1"}
    assert set(labelled(samples, "inferpool_worker_heartbeat_age_seconds", "worker")) == {"0", "1"}
    assert value(samples, "inferpool_template_restarts_total") == 0
