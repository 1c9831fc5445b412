"""--tracing end to end: a live server (--workers 0 with the builtin gRPC server, --workers 2
with grpcio) exports its spans over OTLP/HTTP to a receiver in the test process. A request
sent with a W3C traceparent (REST header, gRPC metadata) comes back as a span tree in the
caller's trace: the frontend's SERVER span and its queue/decode/predict/encode children
from the worker's timings. Requests batched into one execution link to its span."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server
from tests.support.grpc import infer_request
from tests.support.otlp import Received, Span, exporter_env, http_receiver
from tests.support.pool import sum_request, write_counting_model

pytestmark = pytest.mark.timeout(120)

SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER
ERROR = 2  # Status.StatusCode.STATUS_CODE_ERROR
STAGES = ["queue", "decode", "predict", "encode"]
ROWS = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
GRPC_METHOD = "inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[str, Received]]:
    with http_receiver() as found:
        yield found


@pytest.fixture(scope="module", params=[(0, "builtin"), (2, "grpcio")], ids=["w0", "w2-grpcio"])
def server(
    request: pytest.FixtureRequest,
    receiver: tuple[str, Received],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    workers, implementation = request.param
    repository = tmp_path_factory.mktemp("repo")
    calls = repository / "calls.txt"
    write_counting_model(repository, "sums", calls)
    # One replica, so that concurrent requests queue in one worker and are batched.
    write_counting_model(
        repository, "batched", calls, replicas=1, max_batch_size=8, max_batch_time=0.3
    )
    flags = ["--workers", str(workers), "--grpc-implementation", implementation, "--tracing"]
    endpoint, _ = receiver
    with Server(repository, *flags, env=exporter_env("http/protobuf", endpoint)) as running:
        running.wait_ready(timeout=90)
        running.workers = workers  # type: ignore[attr-defined]
        yield running


def traceparent() -> tuple[int, int, str]:
    trace_id, parent_id = random.getrandbits(128) | 1, random.getrandbits(64) | 1
    return trace_id, parent_id, f"00-{trace_id:032x}-{parent_id:016x}-01"


def tree(spans: list[Span]) -> tuple[Span, dict[str, Span]]:
    """The request span and its children by name (each name once)."""
    (request,) = [span for span in spans if span.kind == SERVER_KIND]
    children = {span.name: span for span in spans if span.parent_id == request.span_id}
    assert len(children) == len(spans) - 1
    return request, children


def check_stages(request: Span, children: dict[str, Span]) -> None:
    assert set(children) == set(STAGES)
    ordered = [children[name] for name in STAGES]
    for before, after in itertools.pairwise(ordered):
        assert before.end_ns == after.start_ns  # laid end to end
    assert request.start_ns <= ordered[0].start_ns
    assert ordered[-1].end_ns <= request.end_ns
    assert all(span.service == "inferpool-under-test" for span in [request, *ordered])


def test_a_rest_request_continues_the_callers_trace(
    server: Server, receiver: tuple[str, Received]
) -> None:
    trace_id, parent_id, header = traceparent()
    response = httpx.post(
        f"{server.url}/v2/models/sums/infer",
        json=sum_request(ROWS, "v2-id"),
        headers={"traceparent": header, "tracestate": "vendor=1", "x-request-id": "trace-me"},
    )
    assert response.status_code == 200, response.text
    request, children = tree(receiver[1].trace(trace_id, 5))
    assert request.name == "POST /v2/models/{name}/infer"
    assert request.parent_id == parent_id
    attributes = request.attributes
    assert attributes["http.response.status_code"] == 200
    assert attributes["inferpool.model.name"] == "sums"
    assert attributes["inferpool.request.id"] == "trace-me"
    assert attributes["inferpool.rows"] == 2
    assert attributes["client.address"] == "127.0.0.1"
    check_stages(request, children)


def test_a_grpc_request_continues_the_callers_trace(
    server: Server, receiver: tuple[str, Received]
) -> None:
    trace_id, parent_id, header = traceparent()
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        message = infer_request("sums", x=np.asarray(ROWS))
        stub.ModelInfer(message, metadata=[("traceparent", header)], timeout=30)
    request, children = tree(receiver[1].trace(trace_id, 5))
    assert request.name == GRPC_METHOD
    assert request.parent_id == parent_id
    assert request.attributes["rpc.grpc.status_code"] == 0  # OK
    assert request.attributes["inferpool.model.name"] == "sums"
    check_stages(request, children)


def test_a_failed_request_is_one_span_with_its_error(
    server: Server, receiver: tuple[str, Received]
) -> None:
    trace_id, _, header = traceparent()
    body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64", "data": ["a", 2, 3]}]}
    response = httpx.post(
        f"{server.url}/v2/models/sums/infer", json=body, headers={"traceparent": header}
    )
    assert response.status_code == 400
    (request,) = receiver[1].trace(trace_id, 1)
    assert request.attributes["error.type"] == "400"
    assert request.status != ERROR  # the client's mistake
    # A gRPC call for a model that does not exist: NOT_FOUND.
    trace_id, _, header = traceparent()
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(
                infer_request("nope", x=np.ones((1, 3))), metadata=[("traceparent", header)]
            )
    assert raised.value.code() is grpc.StatusCode.NOT_FOUND
    (request,) = receiver[1].trace(trace_id, 1)
    assert request.attributes["error.type"] == "NOT_FOUND"
    assert request.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]


def test_requests_batched_together_link_to_one_execution_span(
    server: Server, receiver: tuple[str, Received]
) -> None:
    parents = [traceparent() for _ in range(4)]

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            url = f"{server.url}/v2/models/batched/infer"
            return await asyncio.gather(
                *(
                    client.post(
                        url, json=sum_request([[i, 1, 2]], f"b{i}"), headers={"traceparent": h}
                    )
                    for i, (_, _, h) in enumerate(parents)
                )
            )

    responses = asyncio.run(send_all())
    assert [r.status_code for r in responses] == [200] * 4
    predicts = []
    for trace_id, _, _ in parents:
        _, children = tree(receiver[1].trace(trace_id, 5))
        predicts.append(children["predict"])
    linked = {link for span in predicts for link in span.links}
    assert len(linked) >= 1 and all(len(span.links) == 1 for span in predicts), predicts
    # Each linked span is an execution span the server exported, in a trace of its own.
    for trace_id, span_id in linked:
        (execution,) = receiver[1].wait_for(
            lambda spans, span_id=span_id: [s for s in spans if s.span_id == span_id]
        )
        assert execution.name == "execution" and execution.parent_id == 0
        assert execution.trace_id == trace_id not in {t for t, _, _ in parents}
        assert execution.attributes["inferpool.model.name"] == "batched"
    # Four concurrent requests in one queue: at least two ran in one execution.
    assert len(linked) < 4
