"""RequestTracer (inferpool.observability.tracing) on the SDK's in-memory exporter: the
request span and its remote parent, the stage spans laid out from the reply's times, the
execution span that batched requests link to, error status, sampling; configure() from
the settings and OTEL_* variables; the execution id the worker path puts in the replies."""

from __future__ import annotations

import logging
import sys
import time

import numpy as np
import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from inferpool import Runtime
from inferpool.engine.ipc import messages
from inferpool.engine.ipc.messages import Kind, Reply, RequestHeader, StageTimes
from inferpool.engine.worker.path import Job, run_group
from inferpool.observability import tracing
from inferpool.observability.tracing import RequestTracer
from inferpool.settings import ServerSettings
from tests.support.runtimes import loaded_sums_model

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"
START = 1_700_000_000_000_000_000  # wall-clock ns
END = START + 10_000_000
ROUTE = "POST /v2/models/{name}/infer"


@pytest.fixture
def exported() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def tracer_on(exporter: InMemorySpanExporter, **provider: object) -> RequestTracer:
    sdk = TracerProvider(**provider)  # type: ignore[arg-type]
    sdk.add_span_processor(SimpleSpanProcessor(exporter))
    return RequestTracer(sdk)


def finish(tracer: RequestTracer, **given: object) -> None:
    arguments: dict[str, object] = {
        "protocol": "rest", "method": ROUTE, "model": "iris", "version": None,
        "traceparent": TRACEPARENT, "tracestate": None, "start_ns": START, "end_ns": END,
        "code": 200, "request_id": "req-1", "peer": "127.0.0.1:40000",
        "reply": Reply(200, b"{}", None, StageTimes(1000, 2000, 3000, 4000), rows=2, execution=2),
    }  # fmt: skip
    arguments.update(given)
    tracer.finish(**arguments)  # type: ignore[arg-type]


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


def test_the_request_span_continues_the_callers_trace(exported: InMemorySpanExporter) -> None:
    finish(tracer_on(exported), tracestate="vendor=x")
    request = by_name(exported.get_finished_spans())[ROUTE]
    assert request.kind is SpanKind.SERVER
    assert request.context is not None and request.parent is not None
    assert request.context.trace_id == TRACE_ID
    assert request.parent.span_id == PARENT_ID and request.parent.is_remote
    assert request.context.trace_state.get("vendor") == "x"
    assert (request.start_time, request.end_time) == (START, END)
    assert dict(request.attributes or {}) == {
        "http.request.method": "POST",
        "http.route": "/v2/models/{name}/infer",
        "http.response.status_code": 200,
        "inferpool.model.name": "iris",
        "inferpool.model.version": "",
        "inferpool.protocol": "rest",
        "inferpool.request.id": "req-1",
        "client.address": "127.0.0.1",
        "client.port": 40000,
        "inferpool.rows": 2,
    }
    assert request.status.status_code is StatusCode.UNSET


def test_stage_spans_are_laid_end_to_end_up_to_the_requests_end(
    exported: InMemorySpanExporter,
) -> None:
    finish(tracer_on(exported))
    spans = by_name(exported.get_finished_spans())
    request = spans.pop(ROUTE)
    assert request.context is not None
    assert list(spans) == ["queue", "decode", "predict", "encode"]
    begin = END - 10_000
    for name, duration in zip(spans, (1000, 2000, 3000, 4000), strict=True):
        span = spans[name]
        assert span.parent is not None and span.parent.span_id == request.context.span_id
        assert span.context is not None and span.context.trace_id == TRACE_ID
        assert (span.start_time, span.end_time) == (begin, begin + duration)
        assert not span.links
        begin += duration
    assert begin == END


def test_stages_longer_than_the_request_are_clipped_at_its_start(
    exported: InMemorySpanExporter,
) -> None:
    times = StageTimes(8_000_000, 1_000_000, 2_000_000, 1_000_000)  # 12 ms in a 10 ms request
    finish(tracer_on(exported), reply=Reply(200, b"", None, times, 1, 1))
    spans = by_name(exported.get_finished_spans())
    assert spans["queue"].start_time == START
    assert spans["encode"].end_time == END


def test_without_traceparent_or_with_a_bad_one_a_trace_starts_here(
    exported: InMemorySpanExporter,
) -> None:
    tracer = tracer_on(exported)
    finish(tracer, traceparent=None)
    finish(tracer, traceparent="00-nothex-nothex-01")
    requests = [s for s in exported.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert len(requests) == 2
    for span in requests:
        assert span.parent is None
        assert span.context is not None and span.context.trace_id != TRACE_ID


def test_a_batched_execution_is_one_span_that_each_request_links_to(
    exported: InMemorySpanExporter,
) -> None:
    tracer = tracer_on(exported)
    shared = 50_000  # the execution's predict: the same duration in each of its replies
    for position, request_id in enumerate(("a", "b", "c")):
        times = StageTimes(1000 * (position + 1), 2000, shared, 3000)
        reply = Reply(200, b"", None, times, 1, 3 if position == 0 else -3, execution_id=9)
        finish(tracer, reply=reply, request_id=request_id)
    # Another execution with the same id (another worker's): a span of its own.
    other = Reply(200, b"", None, StageTimes(1, 1, 40_000, 1), 2, 2, execution_id=9)
    finish(tracer, reply=other, request_id="d")
    spans = exported.get_finished_spans()
    executions = [span for span in spans if span.name == "execution"]
    assert len(executions) == 2
    first, second = executions
    assert first.parent is None and first.kind is SpanKind.INTERNAL
    assert first.context is not None and first.context.trace_id != TRACE_ID
    assert dict(first.attributes or {}) == {
        "inferpool.model.name": "iris",
        "inferpool.model.version": "",
        "inferpool.execution.rows": 3,
    }
    assert first.end_time is not None and first.start_time is not None
    assert first.end_time - first.start_time == shared
    predicts = [span for span in spans if span.name == "predict"]
    linked = [[link.context.span_id for link in span.links] for span in predicts]
    assert second.context is not None
    assert linked == [[first.context.span_id]] * 3 + [[second.context.span_id]]
    # The requests' own spans stay in the caller's trace.
    assert {span.context.trace_id for span in predicts if span.context} == {TRACE_ID}


def test_a_server_error_is_an_error_status_and_a_client_error_is_not(
    exported: InMemorySpanExporter,
) -> None:
    tracer = tracer_on(exported)
    finish(tracer, code=500, reply=None, error="model 'iris' raised ValueError: boom")
    # As a worker's error reply comes back: no stage ran, its times are zeros.
    refusal = Reply(400, b"bad input", None, StageTimes(), 0, 0)
    finish(tracer, code=400, reply=refusal, error="bad input")
    failed, refused = exported.get_finished_spans()  # no stage spans for either
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "model 'iris' raised ValueError: boom"
    assert failed.attributes is not None and failed.attributes["error.type"] == "500"
    assert refused.status.status_code is StatusCode.UNSET
    assert refused.attributes is not None
    assert refused.attributes["error.type"] == "400"
    assert refused.attributes["inferpool.error"] == "bad input"


def test_grpc_requests_are_named_after_their_method(exported: InMemorySpanExporter) -> None:
    tracer = tracer_on(exported)
    method = "inference.GRPCInferenceService/ModelInfer"
    peer = "ipv6:[::1]:5000"
    finish(tracer, protocol="grpc", method=method, code=503, peer=peer, reply=None, error="gone")
    finish(tracer, protocol="grpc", method=method, code=400, reply=None, error="bad input")
    finish(tracer, protocol="grpc", method=method, code=200, version="2")
    unavailable, invalid, ok = [s for s in exported.get_finished_spans() if s.name == method]
    attributes = dict(unavailable.attributes or {})
    assert attributes["rpc.system"] == "grpc"
    assert attributes["rpc.service"] == "inference.GRPCInferenceService"
    assert attributes["rpc.method"] == "ModelInfer"
    assert attributes["rpc.grpc.status_code"] == 14
    assert attributes["error.type"] == "UNAVAILABLE"
    assert (attributes["client.address"], attributes["client.port"]) == ("::1", 5000)
    assert unavailable.status.status_code is StatusCode.ERROR
    assert invalid.status.status_code is StatusCode.UNSET
    assert invalid.attributes is not None and invalid.attributes["error.type"] == "INVALID_ARGUMENT"
    assert ok.status.status_code is StatusCode.UNSET
    assert ok.attributes is not None and ok.attributes["rpc.grpc.status_code"] == 0
    assert ok.attributes is not None and "error.type" not in ok.attributes
    assert ok.attributes["inferpool.model.version"] == "2"


def test_a_rest_span_is_named_after_its_route(exported: InMemorySpanExporter) -> None:
    tracer = tracer_on(exported)
    finish(tracer, method="POST", reply=None)
    finish(tracer, method="POST", version="2", reply=None)
    finish(tracer, method="GET /v2/models/{name}/ready", reply=None)
    names = [span.name for span in exported.get_finished_spans()]
    assert names == [
        "POST /v2/models/{name}/infer",
        "POST /v2/models/{name}/versions/{version}/infer",
        "GET /v2/models/{name}/ready",
    ]
    routes = [(s.attributes or {})["http.route"] for s in exported.get_finished_spans()]
    assert routes == [name.split(" ")[1] for name in names]


def test_nothing_is_recorded_when_the_sampler_says_no(exported: InMemorySpanExporter) -> None:
    finish(tracer_on(exported, sampler=ALWAYS_OFF))
    # The default sampler follows the caller: an unsampled traceparent records nothing.
    finish(tracer_on(exported), traceparent=TRACEPARENT[:-2] + "00")
    assert exported.get_finished_spans() == ()


def test_configure_is_none_when_tracing_is_off_or_the_sdk_disabled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert tracing.configure(ServerSettings()) is None
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.configure(ServerSettings(tracing=True)) is None


def test_configure_without_opentelemetry_warns_once_and_serves_without(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with caplog.at_level(logging.WARNING, "inferpool.observability.tracing"):
        assert tracing.configure(ServerSettings(tracing=True)) is None
    (record,) = caplog.records
    assert "opentelemetry.sdk.trace is not installed" in record.getMessage()
    assert "inferpool[otel]" in record.getMessage()


def test_the_console_exporter_and_the_service_name_come_from_otel_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "iris-serving")
    tracer = tracing.configure(ServerSettings(tracing=True))
    assert tracer is not None
    finish(tracer)
    tracer.shutdown()  # flushes the batch processor
    printed = capsys.readouterr().out
    assert f'"name": "{ROUTE}"' in printed
    assert '"service.name": "iris-serving"' in printed
    assert f'"trace_id": "0x{TRACE_ID:032x}"' in printed


def test_an_unknown_exporter_or_protocol_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin,otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with caplog.at_level(logging.WARNING, "inferpool.observability.tracing"):
        tracer = tracing.configure(ServerSettings(tracing=True))
    assert tracer is not None
    messages_logged = [record.getMessage() for record in caplog.records]
    assert len(messages_logged) == 2
    assert "'zipkin'" in messages_logged[0] and "'http/json'" in messages_logged[1]
    tracer.shutdown()


def test_the_default_service_name_is_inferpool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    tracer = tracing.configure(ServerSettings(tracing=True))
    assert tracer is not None
    resource = tracer._provider.resource
    assert resource.attributes["service.name"] == "inferpool"
    tracer.shutdown()


# -- the execution id in the replies ----------------------------------------------------
class Sums(Runtime):
    def load(self) -> None:
        pass

    def predict(self, payload, outputs):
        return {outputs[0]: payload.sum(axis=1)}


def job(rows: list[list[float]]) -> Job:
    tensor = {"name": "x", "shape": [len(rows), 2], "datatype": "FP64",
              "data": np.ravel(rows).tolist()}  # fmt: skip
    body = orjson.dumps({"inputs": [tensor]})
    return Job(RequestHeader(1, 0, Kind.REST, None, 0, time.monotonic_ns(), len(body)), body)


def test_requests_predicted_together_share_an_execution_id_and_one_alone_has_none() -> None:
    model = loaded_sums_model(Sums)
    first = run_group(model, [job([[1, 2]]), job([[3, 4], [5, 6]])])
    second = run_group(model, [job([[1, 2]]), job([[3, 4]])])
    alone = run_group(model, [job([[1, 2]])])
    assert first[0].execution_id == first[1].execution_id != 0
    assert second[0].execution_id == second[1].execution_id not in (0, first[0].execution_id)
    assert alone[0].execution_id == 0


def test_the_reply_header_carries_the_execution_id() -> None:
    reply = Reply(200, b"x", None, StageTimes(1, 2, 3, 4), 1, -2, execution_id=2**32 - 1)
    packed = messages.reply_header(3, reply)
    assert len(packed) == messages.HEADER_SIZE
    assert messages.ReplyHeader.unpack_from(packed).execution_id == 2**32 - 1
    assert Reply.from_fields(messages.HEADER.unpack(packed), b"x") == reply
