"""The fields of ``ServerSettings``, declared in groups by concern (what its flags'
``--help`` sections mostly follow), with their defaults, bounds and descriptions.

Each group is a class that extends the one before, so that the fields keep one order
(pydantic lists a parent's fields first): ``ServerSettings`` (``inferpool.settings.server``)
extends the last and adds the repository API's fields, the validators and the sources.

A new setting is a field in the group of its concern, with a ``description``, and a line
in ``inferpool/cli_flags.py`` FIELD_GROUPS (its flag's section and place in ``--help``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, NoDecode

from inferpool.mlserver.contract.cors import CORSSettings

MIB = 1024 * 1024
MAX_PORT = 65535
# The default bucket bounds of the /metrics histograms: seconds, and rows per execution.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class WorkerGroupSettings(BaseModel):
    """Workers beyond the server's own: with tags, and optionally their own environment
    (a tarball or a folder, as a model names one: ``engine/environments/unpack.py``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    workers: int = Field(1, ge=1)
    environment: str | None = None
    tags: list[str] = Field(default_factory=list)


class NetworkFields(BaseSettings):
    """Where the models come from and the listeners: addresses, ports, protocols, metrics."""

    model_repository: Path | None = Field(None, description="folder of model folders")
    host: str = Field("0.0.0.0", description="address the REST, gRPC and metrics servers bind")
    http_port: int = Field(8080, ge=1, le=MAX_PORT, description="REST (V2 HTTP) port")
    grpc_port: int = Field(
        8081, le=MAX_PORT, description="gRPC port; 0 or a negative value disables gRPC"
    )
    grpc_implementation: Literal["builtin", "grpcio"] = Field(
        "builtin",
        description="gRPC server: builtin (inferpool's HTTP/2, fastest) or grpcio (grpc.aio)",
    )
    grpc_reflection: bool = Field(
        True,
        description="serve gRPC server reflection (grpc.reflection.v1 and v1alpha) on the "
        "gRPC port, so that grpcurl and Postman list and call the services without the "
        ".proto files",
    )
    grpc_stream_response: Literal["auto", "triton", "mlserver"] = Field(
        "auto",
        description="ModelStreamInfer's response message: triton (ModelStreamInferResponse), "
        "mlserver (bare ModelInferResponse, as MLServer streams) or auto (mlserver when the "
        "call's first request sends typed contents and no raw_input_contents, as MLServer's "
        "clients do, to an MLServer MLModel runtime; triton otherwise, as tritonclient "
        "always sends raw contents)",
    )
    metrics_port: int = Field(
        8082,
        le=MAX_PORT,
        description="Prometheus metrics port; 0 serves /metrics on the REST port instead, "
        "a negative value disables metrics",
    )
    metrics_latency_buckets: Annotated[list[float], NoDecode] = Field(
        list(LATENCY_BUCKETS),
        description="upper bounds (seconds) of the latency histograms' buckets, as a comma "
        "list or a JSON list",
    )
    metrics_batch_buckets: Annotated[list[float], NoDecode] = Field(
        list(BATCH_BUCKETS),
        description="upper bounds (rows) of the batch-size histogram's buckets, as a comma "
        "list or a JSON list",
    )


class WorkerFields(NetworkFields):
    """The worker processes: how many, their limits and recycling, tags, groups, environments."""

    workers: int = Field(
        os.cpu_count() or 1,
        ge=0,
        description="worker processes; 0 runs models in the server process",
    )
    max_queue: int = Field(
        128, ge=1, description="requests queued per worker; beyond that a request gets 503"
    )
    worker_memory_limit: int = Field(
        0,
        ge=0,
        description="MiB each worker may hold: the placement budget of its models, and a "
        "hard cap on what it allocates beyond what it shares with the template (an "
        "allocation past it answers 500 naming the model, and the worker is replaced); "
        "0: no limit",
    )
    worker_max_requests: int = Field(
        0,
        ge=0,
        description="requests sent to a worker before it is drained and replaced by a fresh "
        "one (each worker draws up to a tenth more, so that they do not all go at once); 0: never",
    )
    worker_max_rss: int = Field(
        0,
        ge=0,
        description="MiB of private memory (pages not shared with the template) a worker may "
        "reach before it is drained and replaced by a fresh one; 0: never",
    )
    worker_heartbeat_timeout: float = Field(
        120.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds a worker may stay silent before it is killed; 0: never",
    )
    worker_tags: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="tags of the server's own workers, met by a model's requirements, as a "
        "comma list or a JSON list",
    )
    worker_groups: list[WorkerGroupSettings] = Field(
        default_factory=list,
        description="more workers, each group with its tags and optionally an environment "
        'of its own: [{"name": "legacy", "workers": 1, "environment": "/envs/sk15.tar.gz", '
        '"tags": ["sklearn-1.5"]}]',
    )
    environment_workers: int = Field(
        1,
        ge=1,
        description="workers started for an environment a model names that no worker group runs",
    )
    environment_tarball: Path | None = Field(
        None,
        description="an environment (tarball or folder) that every model runs in unless it "
        "names its own, as MLServer's MLSERVER_ENV_TARBALL: the models' workers are started "
        "with its interpreter (needs --workers 1 or more)",
    )
    environments_dir: Path | None = Field(
        None,
        description="where environment tarballs are unpacked, by their hash",
    )
    http2: bool = Field(False, description="serve REST with Hypercorn (HTTP/1.1 and h2c)")


class ServingFields(WorkerFields):
    """Start-up, logs, traces, shutdown, CORS and response compression."""

    exit_on_error: bool = Field(True, description="exit non-zero when a model fails at start-up")
    load_models_at_startup: bool = Field(
        True,
        description="load the repository's models at start-up; false: only the repository "
        "API loads them",
    )
    allow_empty: bool = Field(False, description="report ready with no model loaded")
    log_level: str = Field("info", description="debug, info, warning or error")
    log_format: Literal["text", "json"] = Field(
        "text", description="log lines as text, or as one JSON object per line"
    )
    log_levels: Annotated[dict[str, str], NoDecode] = Field(
        {},  # (pydantic copies it for each instance)
        description="levels of single loggers over log_level, e.g. "
        "'inferpool.access=info,uvicorn.error=warning' (or a JSON object)",
    )
    access_log: bool = Field(False, description="log every request (method, model, status, ms)")
    cloudevents: bool = Field(
        True,
        description="add MLServer's CloudEvents headers (ce-id, ce-type, ce-modelid, ...) to "
        "REST inference answers",
    )
    tracing: bool = Field(
        False,
        description="OpenTelemetry spans for every request (the otel extra; exporter, endpoint "
        "and sampler from the standard OTEL_* variables)",
    )
    shutdown_timeout: float = Field(
        30.0, ge=0, allow_inf_nan=False, description="seconds to drain requests on shutdown"
    )
    drain_delay: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds the listeners keep accepting after SIGTERM/SIGINT turned readiness "
        "off (Kubernetes' endpoint removal window; a second signal ends it)",
    )
    cors_settings: CORSSettings | None = Field(
        None,
        description='MLServer\'s CORS keys as JSON, e.g. \'{"allow_origins": ["*"]}\'; '
        "unset: no CORS headers",
    )
    # -- response compression (MLServer's gzip_enabled; docs/operate/compression.md)
    gzip_enabled: bool = Field(
        True,
        description="gzip REST answers of at least --gzip-min-bytes to clients whose "
        "Accept-Encoding accepts it (gRPC: --grpc-response-gzip); false: nothing is gzipped",
    )
    grpc_response_gzip: bool = Field(
        False,
        description="also gzip gRPC response messages of at least --gzip-min-bytes when the "
        "call's grpc-accept-encoding lists gzip. Off by default, as in Triton and MLServer: "
        "grpcio clients list gzip on every call, and tensors barely compress (LightGBM's "
        "256 outputs: 4 in 100 bytes saved for 8-10 in 100 more server CPU a request)",
    )
    gzip_min_bytes: int = Field(
        1024,
        ge=0,
        description="smallest answer body (bytes) that is compressed: a smaller one fits one "
        "packet anyway, and zlib's fixed cost would outweigh the bytes saved",
    )
    gzip_level: int = Field(
        1,
        ge=1,
        le=9,
        description="zlib level of response compression: 1 compresses V2 JSON answers nearly "
        "as well as 6 or 9 at a fraction of their CPU (benchmarks/RESULTS.md)",
    )


class LimitFields(ServingFields):
    """What one request or connection may use: each checked before anything is allocated."""

    # -- limits: each checked before anything is allocated (docs/operate/limits.md)
    # 64 MiB of tensor data and 1 MiB for what comes with it (the binary extension's JSON
    # header, gRPC's message fields): a 64 MiB tensor, as Triton clients send it, passes.
    max_body_bytes: int = Field(
        65 * MIB,
        ge=1,
        description="largest REST request body or gRPC message, in bytes (413); the default "
        "admits a 64 MiB tensor with up to 1 MiB of JSON header or message fields",
    )
    max_tensor_elements: int = Field(
        2**26, ge=1, description="most elements one tensor may declare in its shape (400)"
    )
    max_request_tensor_bytes: int = Field(
        256 * MIB,
        ge=1,
        description="bytes all the tensors of one request may decode to, from their declared "
        "shapes and datatypes (413 / RESOURCE_EXHAUSTED)",
    )
    max_json_depth: int = Field(
        64, ge=1, description="deepest nesting of a JSON request body (400)"
    )
    max_shared_memory_regions: int = Field(
        256,
        ge=0,
        description="system shared-memory regions clients may register at once (each one "
        "costs every worker that uses it a mapping and a file descriptor; 0: the extension "
        "refuses every registration)",
    )
    max_header_bytes: int = Field(
        64 * 1024, ge=1, description="largest request header block (REST or HTTP/2), in bytes"
    )
    max_header_count: int = Field(100, ge=1, description="most header fields in one request")
    max_concurrent_streams: int = Field(
        256, ge=1, description="HTTP/2 streams (calls) open at once on one connection"
    )
    max_unsent_bytes: int = Field(
        256 * MIB,
        ge=0,
        description="answer bytes a frontend process may hold for clients that have not read "
        "them yet, all connections together; past it a large answer is refused (503 / "
        "RESOURCE_EXHAUSTED); 0: no bound",
    )
    max_unsent_bytes_per_connection: int = Field(
        32 * MIB,
        ge=0,
        description="answer bytes one connection may hold unread beyond its first answer; past "
        "it its large answers and its new HTTP/2 streams are refused (RESOURCE_EXHAUSTED); "
        "0: no bound",
    )
    rate_limit: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="requests per second each model takes, unless its model-settings.json "
        "sets parameters.rate_limit; past it a request gets 429 with Retry-After (gRPC "
        "RESOURCE_EXHAUSTED); 0: no limit",
    )
    rate_limit_burst: int = Field(
        0,
        ge=0,
        description="requests a model takes at once under --rate-limit (its token bucket's "
        "size), unless its settings set parameters.rate_limit_burst; 0: one second's worth",
    )
    max_connections: int = Field(
        4096,
        ge=1,
        description="open client connections on all ports together; at the limit the longest "
        "idle one is closed for a new one (capped by the file-descriptor limit)",
    )


class TimeoutFields(LimitFields):
    """Timeouts, stalls and standby workers, and the guarded model load."""

    # -- timeouts, in seconds
    handshake_timeout: float = Field(
        10.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds a new connection may take to send its first request bytes",
    )
    idle_timeout: float = Field(
        60.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds a connection with no request in flight stays open",
    )
    header_timeout: float = Field(
        10.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds a request's headers may take to arrive",
    )
    body_timeout: float = Field(
        60.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds a request's body may take to arrive after its headers",
    )
    write_timeout: float = Field(
        30.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds a peer may leave its answers unread before its connection closes",
    )
    request_timeout: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="deadline of a REST request that sends no Request-Timeout header; 0: none",
    )
    model_timeout: float = Field(
        60.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds one predict may run before it is answered 504 and its worker is "
        "recycled (a model's own 'timeout' overrides it); 0: no limit",
    )
    stall_threshold: float = Field(
        2.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds one call may run before its worker counts as stalled: it takes no "
        "new requests, those queued behind the call move to other replicas, and a standby "
        "worker is forked for the models left without one; 0: never (and with --workers 0, "
        "predicts run on the event loop instead of in threads)",
    )
    max_standby_workers: int = Field(
        2,
        ge=0,
        description="most standby workers running at once beside --workers (forked while "
        "workers are stalled, retired once none is); past it, requests queue behind the "
        "stalled workers. With --workers 0: 1 + this many predict threads",
    )
    model_load_timeout: float = Field(
        300.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds one model's load may run in the worker template process or in "
        "the load probe (--workers 0) before it is killed and the model FAILED as hung; "
        "0: no limit",
    )
    load_probe: bool = Field(
        True,
        description="with --workers 0, load each model of a built-in runtime in a short-lived "
        "child process first, so that a model file that crashes its library fails that model "
        "instead of the server (docs/operate/lifecycle.md)",
    )
