"""--tracing into real OTLP receivers started here on 127.0.0.1: OTLP/gRPC (a grpcio
TraceService) and OTLP/HTTP (POST /v1/traces), each fed by a live server through the
standard OTEL_* variables only. Spans of a REST and a gRPC request sent with a traceparent
arrive with the caller's trace id, their parent ids and the service's name; spans still
buffered when the server is stopped are exported on its way out (a 60 s batch delay)."""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server
from tests.support.grpc import infer_request
from tests.support.otlp import Received, exporter_env, grpc_receiver, http_receiver
from tests.support.pool import sum_request, write_counting_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

STAGES = {"queue", "decode", "predict", "encode"}
ROWS = [[1.0, 2.0, 3.0]]

Receiver = Callable[[], AbstractContextManager[tuple[str, Received]]]
SETUPS = [
    pytest.param("grpc", grpc_receiver, 2, "builtin", id="otlp-grpc-w2-builtin"),
    pytest.param("http/protobuf", http_receiver, 0, "grpcio", id="otlp-http-w0-grpcio"),
]


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    write_counting_model(tmp_path, "sums", tmp_path / "calls.txt")
    return tmp_path


def traceparent() -> tuple[int, int, str]:
    trace_id, parent_id = random.getrandbits(128) | 1, random.getrandbits(64) | 1
    return trace_id, parent_id, f"00-{trace_id:032x}-{parent_id:016x}-01"


def send_requests(server: Server) -> list[tuple[int, int, str]]:
    """A REST and a gRPC inference, each with a traceparent: (trace id, parent id, name)."""
    rest_trace, rest_parent, header = traceparent()
    response = httpx.post(
        f"{server.url}/v2/models/sums/infer",
        json=sum_request(ROWS, "r1"),
        headers={"traceparent": header},
    )
    assert response.status_code == 200, response.text
    grpc_trace, grpc_parent, header = traceparent()
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        message = infer_request("sums", x=np.asarray(ROWS))
        stub.ModelInfer(message, metadata=[("traceparent", header)], timeout=30)
    return [
        (rest_trace, rest_parent, "POST /v2/models/{name}/infer"),
        (grpc_trace, grpc_parent, "inference.GRPCInferenceService/ModelInfer"),
    ]


def check_trees(received: Received, sent: list[tuple[int, int, str]], timeout: float) -> None:
    for trace_id, parent_id, name in sent:
        spans = received.trace(trace_id, 5, timeout)
        (request,) = [span for span in spans if span.parent_id == parent_id]
        assert request.name == name
        children = [span for span in spans if span.parent_id == request.span_id]
        assert {span.name for span in children} == STAGES
        assert all(span.service == "inferpool-under-test" for span in spans)


@pytest.mark.parametrize(("protocol", "receiver", "workers", "implementation"), SETUPS)
def test_spans_reach_an_otlp_receiver(
    repository: Path, protocol: str, receiver: Receiver, workers: int, implementation: str
) -> None:
    with receiver() as (endpoint, received):
        flags = ["--workers", str(workers), "--grpc-implementation", implementation]
        env = exporter_env(protocol, endpoint)
        with Server(repository, *flags, "--tracing", env=env) as server:
            server.wait_ready(timeout=120)
            check_trees(received, send_requests(server), timeout=20)


@pytest.mark.parametrize(("protocol", "receiver", "workers", "implementation"), SETUPS)
def test_spans_still_buffered_are_exported_when_the_server_stops(
    repository: Path, protocol: str, receiver: Receiver, workers: int, implementation: str
) -> None:
    with receiver() as (endpoint, received):
        flags = ["--workers", str(workers), "--grpc-implementation", implementation]
        env = {**exporter_env(protocol, endpoint), "OTEL_BSP_SCHEDULE_DELAY": "60000"}
        with Server(repository, *flags, "--tracing", env=env) as server:
            server.wait_ready(timeout=120)
            sent = send_requests(server)
            assert received.spans == []  # nothing leaves before the batch delay...
            assert server.stop() == 0
        check_trees(received, sent, timeout=1)  # ...but everything left on the way out
