"""OpenTelemetry traces of requests, built after the fact (the ``otel`` extra).

The server creates one ``RequestTracer`` with ``configure(settings)`` (None when tracing is
off: the frontends then do nothing extra per request) and each frontend calls
``RequestTracer.finish`` once a request's response is written or has failed. No span is
open while the request runs, and the workers have no tracer: every span gets explicit
start and end times, from the frontend's clock and from the stage durations the worker
sends back in the reply header (``Reply.times``). The spans of one request::

    POST /v2/models/{model}/infer        SERVER, the remote parent from ``traceparent``
    ├── queue     waiting for a worker (its ring, then its batcher)
    ├── decode    the request's JSON/protobuf read into the runtime's payload
    ├── predict   the runtime's predict (a link to the execution span when batched)
    └── encode    the result written into the response's bytes

A pipeline's request (``engine/pipelines``) has a ``step <name>`` child per child call
instead, each with that call's queue/decode/predict/encode under it.

The reply carries how long each stage took, not when it ran: the four are laid end to end,
backwards from the request's end (the frontend writes a reply out as soon as it arrives,
while a large body is read before the request is handed over, so the end is the nearer
anchor) and clipped at the request's start.

Requests that one batched execution predicted together share an execution id in their
replies (``Reply.execution_id``, 0 when a request was predicted alone). The first of
their replies to reach ``finish`` creates one ``execution`` span (a trace of its own,
spanning the predict); every request's ``predict`` span links to it. The reply does not
name its worker: an execution is recognised by its id, its predict duration and its rows,
which together tell two workers' executions apart (their ids may coincide, their
durations to the nanosecond do not).

Configuration is OpenTelemetry's own: ``OTEL_SERVICE_NAME`` (default ``inferpool``) and
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (read by
the SDK), ``OTEL_TRACES_EXPORTER`` (``otlp``, the default, ``console``, ``none``, or a comma
list), ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc``, the
Python SDK's default, or ``http/protobuf``), the endpoint, header, timeout and TLS variables
(read by the exporters) and ``OTEL_SDK_DISABLED``. Spans leave through a
``BatchSpanProcessor`` (``OTEL_BSP_*``): exporting happens on its thread, never in
``finish``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import grpc

from inferpool import __version__
from inferpool.errors import grpc_code_for
from inferpool.observability.trace_control import CONTROL

if TYPE_CHECKING:
    from collections.abc import Sequence

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Link, Span
    from opentelemetry.util.types import AttributeValue

    from inferpool.engine.ipc.messages import Reply
    from inferpool.engine.pipelines.runner import StepTrace
    from inferpool.settings import ServerSettings

logger = logging.getLogger(__name__)

_STAGES = ("queue", "decode", "predict", "encode")
# Execution spans remembered for the other replies of their execution, which arrive
# together (a worker answers a batch at once): a few per worker would do.
_EXECUTIONS_KEPT = 1024
_INSTALL = "pip install 'inferpool[otel]'"
_INFER = "/v2/models/{name}/infer"
_VERSIONED_INFER = "/v2/models/{name}/versions/{version}/infer"


def configure(settings: ServerSettings) -> RequestTracer | None:
    """The server's tracer, or None when tracing is off (the default), when
    ``OTEL_SDK_DISABLED`` is true, or when OpenTelemetry is not installed (one warning)."""
    if not settings.tracing:
        return None
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        logger.info("tracing: OTEL_SDK_DISABLED is true, no spans are made")
        return None
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporters = _exporters()
    except ImportError as exc:
        logger.warning(
            "tracing is on but %s is not installed (%s): serving without traces",
            exc.name,
            _INSTALL,
        )
        return None
    provider = TracerProvider(resource=_resource())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return RequestTracer(provider)


def _exporters() -> list[SpanExporter]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names; ImportError when one is not installed."""
    exporters: list[SpanExporter] = []
    for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(","):
        name = name.strip().lower()
        if name == "otlp":
            exporters.extend(_otlp_exporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            # The server's stdout now, not the one the SDK's default bound at its import.
            exporters.append(ConsoleSpanExporter(out=sys.stdout))
        elif name not in ("none", ""):
            logger.warning(
                "OTEL_TRACES_EXPORTER names %r, not an exporter inferpool has "
                "(otlp, console, none): ignored",
                name,
            )
    return exporters


def _otlp_exporter() -> list[SpanExporter]:
    """The OTLP exporter of ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``: gRPC unless it says
    http/protobuf (the Python SDK's default); none, with a warning, for another value."""
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    ).strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return [OTLPSpanExporter()]
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HTTPSpanExporter,
        )

        return [HTTPSpanExporter()]
    logger.warning(
        "the OTLP protocol %r is not one inferpool exports with (grpc, http/protobuf): "
        "no OTLP export",
        protocol,
    )
    return []


def _resource() -> Resource:
    """The service's resource: the SDK's detection (``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES``, the process), named ``inferpool`` unless they name it."""
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource

    resource = Resource.create({SERVICE_VERSION: __version__})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "inferpool"}))
    return resource


class RequestTracer:
    """Builds each request's spans once it is over; used on the server's event loop."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._provider = provider
        self._tracer = provider.get_tracer("inferpool", __version__)
        self._propagator = TraceContextTextMapPropagator()
        self._root = Context()  # no parent: a request without traceparent starts a trace
        self._executions: dict[tuple[int, int, int], Link] = {}
        CONTROL.start()  # spans can be made: Triton's trace settings may now turn them off

    def finish(
        self,
        *,
        protocol: str,
        method: str,
        model: str,
        version: str | None,
        traceparent: str | None,
        tracestate: str | None,
        start_ns: int,
        end_ns: int,
        code: int,
        request_id: str | None,
        peer: str | None,
        reply: Reply | None,
        error: str | None = None,
    ) -> None:
        """Record the spans of one request that is over. ``protocol``: ``rest`` or
        ``grpc``. ``method``: for REST the HTTP method (the span is named after the V2
        infer route, ``POST /v2/models/{name}/infer``, or
        ``.../versions/{version}/infer`` when a version was asked for), or the method and
        another route's template (``GET /v2/models/{name}``), the span's name then; for gRPC
        the method (``inference.GRPCInferenceService/ModelInfer``), the span's name.
        ``code`` is the HTTP status of the outcome: for gRPC the HTTP status the gRPC status
        sent stands for (``errors.HTTP_OF_GRPC``), as the metrics count it; the span's
        ``rpc.grpc.status_code`` is the gRPC status inferpool answers that HTTP status with
        (``errors.grpc_code_for``). ``start_ns`` and ``end_ns`` are wall-clock nanoseconds
        (``time.time_ns()``) at the request's arrival and once its response was written.
        ``peer``: the client's address (``host:port``, ``[v6]:port``, grpcio's
        ``ipv4:host:port``). ``reply``: the worker's, if reached (its stage times make the
        child spans); ``error``: a failure's message. A 5xx sets the span's status to
        ERROR; a 4xx only ``error.type``. An invalid ``traceparent`` starts a new trace.
        No span at all when the trace settings (``trace_control``) leave the request out.
        """
        if not CONTROL.admit(model):
            return
        parent = self._parent(traceparent, tracestate)
        name, attributes, failed, error_type = _describe(protocol, method, version, code)
        _add_request(attributes, protocol, model, version, request_id, peer, reply)
        span = self._tracer.start_span(
            name, parent, self._trace.SpanKind.SERVER, attributes, start_time=start_ns
        )
        if span.is_recording():  # else not sampled: nothing more to build
            if failed:
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error))
            if error_type is not None:
                span.set_attribute("error.type", error_type)
                if error is not None:
                    span.set_attribute("inferpool.error", error)
            # Only a reply that ran carries stage times (a worker's error reply has zeros).
            if reply is not None and reply.status == 200 and reply.times is not None:
                self._stages(span, model, version, reply, start_ns, end_ns)
            if steps := getattr(reply, "steps", None):  # a pipeline's (engine/pipelines)
                self._steps(span, steps)
        span.end(end_ns)

    def _parent(self, traceparent: str | None, tracestate: str | None) -> Any:
        """The context a request's span continues: the caller's trace, else a new one."""
        if not traceparent:
            return self._root
        carrier = {"traceparent": traceparent}
        if tracestate:
            carrier["tracestate"] = tracestate
        return self._propagator.extract(carrier, self._root)

    def _steps(self, span: Span, steps: Sequence[StepTrace]) -> None:
        """A pipeline's child calls: a ``step <name>`` span each, at the times the
        pipeline called and heard from the child, with the child's own stages (or steps,
        for a pipeline in a pipeline) under it."""
        context = self._trace.set_span_in_context(span)
        for step in steps:
            attributes: dict[str, AttributeValue] = {
                "inferpool.step.index": step.index,
                "inferpool.step.name": step.step,
                "inferpool.model.name": step.model,
                "inferpool.step.status": step.status,
            }
            child = self._tracer.start_span(
                f"step {step.step}", context, attributes=attributes, start_time=step.start_ns
            )
            if step.status >= 500:
                child.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
            reply = step.reply
            if reply is not None and reply.status == 200 and reply.times is not None:
                self._stages(child, step.model, None, reply, step.start_ns, step.end_ns)
            if reply is not None and getattr(reply, "steps", None):
                self._steps(child, reply.steps)  # type: ignore[attr-defined]
            child.end(step.end_ns)

    def _stages(
        self,
        span: Span,
        model: str,
        version: str | None,
        reply: Reply,
        start_ns: int,
        end_ns: int,
    ) -> None:
        """The queue/decode/predict/encode children, laid end to end before ``end_ns``."""
        times = reply.times
        assert times is not None
        durations = (times.queue, times.compute_input, times.compute_infer, times.compute_output)
        begin = max(start_ns, end_ns - sum(durations))
        context = self._trace.set_span_in_context(span)
        for stage, duration in zip(_STAGES, durations, strict=True):
            until = min(begin + duration, end_ns)
            links: tuple[Link, ...] = ()
            if stage == "predict" and reply.execution_id:
                links = (self._execution(model, version, reply, begin, until),)
            child = self._tracer.start_span(stage, context, links=links, start_time=begin)
            child.end(until)
            begin = until

    def _execution(
        self, model: str, version: str | None, reply: Reply, start_ns: int, end_ns: int
    ) -> Link:
        """The link to the span of the batched execution ``reply`` ran in, which the first
        of its replies creates."""
        assert reply.times is not None
        rows = abs(reply.execution)
        key = (reply.execution_id, reply.times.compute_infer, rows)
        link = self._executions.get(key)
        if link is None:
            attributes: dict[str, AttributeValue] = {
                "inferpool.model.name": model,
                "inferpool.model.version": version or "",
                "inferpool.execution.rows": rows,
            }
            execution = self._tracer.start_span(
                "execution", self._root, attributes=attributes, start_time=start_ns
            )
            execution.end(end_ns)
            link = self._trace.Link(execution.get_span_context())
            if len(self._executions) >= _EXECUTIONS_KEPT:
                del self._executions[next(iter(self._executions))]
            self._executions[key] = link
        return link

    def shutdown(self) -> None:
        """Export what is still buffered, then stop the exporters (the server's exit)."""
        self._provider.shutdown()


def _describe(
    protocol: str, method: str, version: str | None, code: int
) -> tuple[str, dict[str, AttributeValue], bool, str | None]:
    """The request span's name, its protocol's attributes (OpenTelemetry's semantic
    conventions for HTTP and RPC servers), whether ``code`` is the server's failure, and
    the ``error.type`` of a failed request (None when it succeeded)."""
    if protocol == "grpc":
        path = method.lstrip("/")
        service, _, rpc = path.rpartition("/")
        status = grpc.StatusCode[grpc_code_for(code)]
        attributes: dict[str, AttributeValue] = {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": rpc,
            "rpc.grpc.status_code": status.value[0],
        }
        return path, attributes, code >= 500, status.name if code >= 400 else None
    verb, _, route = method.partition(" ")
    if not route:
        route = _VERSIONED_INFER if version else _INFER
    attributes = {
        "http.request.method": verb,
        "http.route": route,
        "http.response.status_code": code,
    }
    return f"{verb} {route}", attributes, code >= 500, str(code) if code >= 400 else None


def _add_request(
    attributes: dict[str, AttributeValue],
    protocol: str,
    model: str,
    version: str | None,
    request_id: str | None,
    peer: str | None,
    reply: Reply | None,
) -> None:
    """The request span's attributes that name the model, the request and the client."""
    attributes["inferpool.model.name"] = model
    attributes["inferpool.model.version"] = version or ""
    attributes["inferpool.protocol"] = protocol
    if request_id is not None:
        attributes["inferpool.request.id"] = request_id
    if peer:
        attributes.update(_peer(peer))
    if reply is not None and reply.rows:
        attributes["inferpool.rows"] = reply.rows


def _peer(peer: str) -> dict[str, AttributeValue]:
    """``client.address`` (and ``client.port``) from ``host:port``, ``[v6]:port`` or
    grpcio's ``ipv4:host:port`` / ``ipv6:[v6]:port``; anything else as it is."""
    address = peer.removeprefix("ipv4:").removeprefix("ipv6:")
    host, colon, port = address.rpartition(":")
    if colon and port.isdigit() and (":" not in host or host.startswith("[")):
        return {"client.address": host.strip("[]"), "client.port": int(port)}
    return {"client.address": address}
