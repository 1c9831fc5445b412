"""OTLP trace receivers started by a test on 127.0.0.1: OTLP/HTTP (``POST /v1/traces``, a
protobuf ``ExportTraceServiceRequest``) and OTLP/gRPC (``TraceService/Export``), each
collecting the spans a server exports, and the environment that points a server at them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support import free_port


@dataclass(frozen=True)
class Span:
    """A received span, with its ids as integers and its attributes as Python values."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int  # 0: a root span
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: list[tuple[int, int]]  # (trace id, span id)
    status: int  # Status.StatusCode: 0 unset, 1 ok, 2 error
    service: str  # the resource's service.name


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value") or "string_value")


@dataclass
class Received:
    """The spans a receiver got so far (added from its server's threads)."""

    spans: list[Span] = field(default_factory=list)
    _lock: threading.Condition = field(default_factory=threading.Condition)

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        Span(
                            span.name,
                            int.from_bytes(span.trace_id, "big"),
                            int.from_bytes(span.span_id, "big"),
                            int.from_bytes(span.parent_span_id or b"\0", "big"),
                            span.kind,
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            {a.key: _value(a.value) for a in span.attributes},
                            [
                                (
                                    int.from_bytes(link.trace_id, "big"),
                                    int.from_bytes(link.span_id, "big"),
                                )
                                for link in span.links
                            ],
                            span.status.code,
                            resource.get("service.name", ""),
                        )
                    )
        with self._lock:
            self.spans.extend(found)
            self._lock.notify_all()

    def wait_for(
        self, found: Callable[[list[Span]], list[Span]], timeout: float = 10
    ) -> list[Span]:
        """``found(spans)`` once it is not empty; AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not (result := found(list(self.spans))):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({span.name for span in self.spans})
                    raise AssertionError(f"not received in {timeout}s; spans so far: {names}")
                self._lock.wait(left)
        return result

    def trace(self, trace_id: int, count: int, timeout: float = 10) -> list[Span]:
        """The ``count`` spans of trace ``trace_id`` (waits until that many arrived)."""

        def complete(spans: list[Span]) -> list[Span]:
            mine = [span for span in spans if span.trace_id == trace_id]
            return mine if len(mine) >= count else []

        return self.wait_for(complete, timeout)


@contextmanager
def http_receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/HTTP receiver: (its traces endpoint URL, what it received)."""
    received = Received()
    empty = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            received.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(empty)))
            self.end_headers()
            self.wfile.write(empty)

        def log_message(self, *args: object) -> None:
            pass  # no line per export on the test's stderr

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/gRPC receiver (grpcio, plaintext): (its endpoint URL, what it received)."""
    received = Received()

    class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            received.add(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(None).wait()


def exporter_env(protocol: str, endpoint: str) -> dict[str, str]:
    """The OTEL_* variables that send a server's spans to a receiver at once (a 50 ms
    batch delay rather than 5 s)."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "inferpool-under-test",
    }
