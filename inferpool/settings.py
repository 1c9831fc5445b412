"""Server and model settings, with every default in one place.

Precedence, lowest first: defaults < MLServer's ``MLSERVER_*`` environment variables <
``settings.json`` (in the model repository, as MLServer reads it: its keys win over its
variables) < ``INFERPOOL_*`` environment variables < command-line flags. MLServer's
``settings.json`` and ``model-settings.json`` are read as they are: inferpool.mlserver_env
(server) and inferpool.mlserver_models (models) map or refuse each of MLServer's keys and
warn about unknown ones.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    JsonConfigSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from inferpool.logs import parse_level, parse_levels
from inferpool.mlserver_env import (
    cors_with_environment,
    environment_values,
    server_values,
    warn_idle_cors_variables,
)
from inferpool.mlserver_models import (
    check_model_keys,
    single_model_repository,
    with_model_environment,
)
from inferpool.pipeline_settings import PipelineSpec
from inferpool.protocol.datatypes import DATATYPES, element_count
from inferpool.protocol.types import TensorSpec

SETTINGS_FILE = "settings.json"
MIB = 1024 * 1024
MAX_PORT = 65535
MODEL_SETTINGS_FILE = "model-settings.json"
# The default bucket bounds of the /metrics histograms: seconds, and rows per execution.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

_settings_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "inferpool_settings_file", default=None
)


class CORSSettings(BaseModel):
    """MLServer's ``cors_settings``: the same keys and defaults (Starlette's CORSMiddleware)."""

    # Unknown keys are ignored as MLServer does, after a warning (see mlserver_env).
    model_config = ConfigDict(extra="ignore", frozen=True)

    allow_origins: list[str] = Field(
        default_factory=list, description="origins allowed to make cross-origin requests"
    )
    allow_origin_regex: str | None = Field(None, description="regex of allowed origins")
    allow_credentials: bool = Field(False, description="support cookies on CORS requests")
    allow_methods: list[str] = Field(default_factory=lambda: ["GET"])
    allow_headers: list[str] = Field(default_factory=list)
    expose_headers: list[str] = Field(default_factory=list)
    max_age: int = Field(600, description="seconds browsers may cache a CORS answer")

    @field_validator("*", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: Any) -> Any:
        # MLServer's fields are Optional: an explicit null there means "the default".
        if value is None:
            field = cls.model_fields[info.field_name]
            return field.get_default(call_default_factory=True)
        return value


class WorkerGroupSettings(BaseModel):
    """Workers beyond the server's own: with tags, and optionally their own environment
    (a tarball or a folder, as a model names one: ``engine/environments/unpack.py``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    workers: int = Field(1, ge=1)
    environment: str | None = None
    tags: list[str] = Field(default_factory=list)


class ServerSettings(BaseSettings):
    """Everything that configures one server process; ``inferpool serve --help`` lists it."""

    model_config = SettingsConfigDict(env_prefix="INFERPOOL_", extra="ignore")

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
        description="gzip answers of at least --gzip-min-bytes to clients that accept it "
        "(REST Accept-Encoding, gRPC grpc-accept-encoding)",
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

    # -- limits: each checked before anything is allocated (README, "Limits and security")
    max_body_bytes: int = Field(
        64 * MIB,
        ge=1,
        description="largest REST request body or gRPC message, in bytes (413)",
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
    max_connections: int = Field(
        4096,
        ge=1,
        description="open client connections on all ports together; at the limit the longest "
        "idle one is closed for a new one (capped by the file-descriptor limit)",
    )
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
    # -- the model repository API
    model_control_mode: Literal["none", "explicit", "poll"] = Field(
        "explicit",
        description="none: the models of the repository at start-up, no load/unload API; "
        "explicit: the repository API loads and unloads models; "
        "poll: the repository is watched: a model folder added, changed or removed is "
        "loaded, reloaded or unloaded (the load/unload API works too)",
    )
    repository_debounce: float = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="poll mode: seconds a changed model folder must stay quiet "
        "before it is acted on",
    )
    admin_token: str | None = Field(
        None,
        description="token that load/unload and other admin calls must carry "
        "(Authorization: Bearer TOKEN); unset: no token asked",
    )
    admin_token_file: Path | None = Field(
        None, description="file holding the admin token (read at start-up)"
    )

    @field_validator("worker_tags", mode="before")
    @classmethod
    def _parse_tags(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [t for t in text.split(",") if t]
        return value

    @field_validator("worker_groups")
    @classmethod
    def _distinct_group_names(cls, groups: list[WorkerGroupSettings]) -> list[WorkerGroupSettings]:
        names = [group.name for group in groups]
        if len(set(names)) != len(names) or "default" in names:
            raise ValueError(f"worker group names must differ and not be 'default': {names}")
        return groups

    @field_validator("log_levels", mode="before")
    @classmethod
    def _parse_log_levels(cls, value: Any) -> dict[str, str]:
        return parse_levels(value)

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        parse_level(value)
        return value

    @field_validator("metrics_latency_buckets", "metrics_batch_buckets", mode="before")
    @classmethod
    def _parse_buckets(cls, value: Any) -> Any:
        return _histogram_bounds(value)

    @field_validator("cors_settings", mode="before")
    @classmethod
    def _cors_keys_from_environment(cls, value: Any) -> Any:
        return cors_with_environment(value, os.environ) if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _mlserver_rules(self) -> ServerSettings:
        # Nothing is loaded at start-up: ready with no model (as MLServer), unless told.
        if not self.load_models_at_startup and "allow_empty" not in self.model_fields_set:
            self.allow_empty = True
        if self.cors_settings is None:
            warn_idle_cors_variables(os.environ)
        if self.environment_tarball is not None:
            self._use_server_environment(self.environment_tarball)
        return self

    def _use_server_environment(self, tarball: Path) -> None:
        """Every model runs in ``environment_tarball``: in workers of its own interpreter,
        as many as the server's own unless ``environment_workers`` says otherwise."""
        if self.workers <= 0:
            raise ValueError(
                f"environment_tarball {tarball}: the models run in workers "
                "started with that environment's interpreter, and with --workers 0 there "
                "is none; give --workers 1 or more"
            )
        # Absolute now: a relative path means the directory the server was started in.
        self.environment_tarball = Path(os.path.abspath(tarball))
        if "environment_workers" not in self.model_fields_set:
            self.environment_workers = self.workers

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest first. As in MLServer, a key of settings.json wins over its MLSERVER_*
        # variable (MLServer passes the file's keys to its Settings, over its environment).
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _settings_file.get()
        if path is not None:
            sources.append(_MLServerJsonSource(settings_cls, json_file=path))
        sources.append(_MLServerEnvSource(settings_cls))
        return tuple(sources)


class _MLServerEnvSource(PydanticBaseSettingsSource):
    """MLServer's ``MLSERVER_*`` variables, mapped to our settings (or refused)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads every variable at once

    def __call__(self) -> dict[str, Any]:
        return environment_values(os.environ, self.settings_cls.model_fields)


class _MLServerJsonSource(JsonConfigSettingsSource):
    """``settings.json``, with MLServer's key names mapped to ours (or refused)."""

    def __init__(self, settings_cls: type[BaseSettings], json_file: Path) -> None:
        super().__init__(settings_cls, json_file=json_file)
        self.path = json_file

    def __call__(self) -> dict[str, Any]:
        raw = super().__call__()
        return server_values(raw, self.settings_cls.model_fields, str(self.path))


def _histogram_bounds(value: Any) -> list[float]:
    """A histogram's bucket bounds: a list, or a comma list or JSON list as text (the
    environment, the command line); positive, finite, increasing, at least one."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else text.split(",")
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list: {exc}") from None
    if not isinstance(value, list | tuple) or not value:
        raise ValueError("give at least one bucket bound")
    try:
        bounds = [float(bound) for bound in value]
    except (TypeError, ValueError):
        raise ValueError(f"bucket bounds must be numbers, got {value!r}") from None
    if not all(0 < bound < float("inf") for bound in bounds):
        raise ValueError(f"bucket bounds must be positive and finite, got {bounds}")
    if any(a >= b for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"bucket bounds must increase, got {bounds}")
    return bounds


def load_server_settings(repository: Path | None, overrides: dict[str, Any]) -> ServerSettings:
    """Settings for a server of ``repository``; ``overrides`` are the CLI flags given."""
    if repository is None:
        # The environment's (or, in single-model mode, the folder of its model's URI).
        repository = ServerSettings().model_repository or single_model_repository(os.environ)
    path = repository / SETTINGS_FILE if repository is not None else None
    token = _settings_file.set(path if path is not None and path.is_file() else None)
    try:
        if repository is not None:
            overrides = {"model_repository": repository, **overrides}
        return ServerSettings(**overrides)
    finally:
        _settings_file.reset(token)


class ModelParameters(BaseModel):
    """The ``parameters`` block of a model-settings file (MLServer's shape)."""

    model_config = ConfigDict(extra="allow")

    uri: str | None = None
    version: str | None = None
    content_type: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class LatestVersions(BaseModel):
    """Serve the ``num_versions`` newest versions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_versions: StrictInt = Field(ge=1)


class AllVersions(BaseModel):
    """Serve every version the repository holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SpecificVersions(BaseModel):
    """Serve the versions listed (numbers or strings, compared as version strings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    versions: tuple[str, ...]

    @field_validator("versions", mode="before")
    @classmethod
    def _as_strings(cls, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list | tuple) or not value:
            raise ValueError(f"give a list of at least one version, not {value!r}")
        versions = []
        for version in value:
            # A JSON true is no version, though Python's bool is an int.
            if isinstance(version, int) and not isinstance(version, bool):
                versions.append(str(version))
            elif isinstance(version, str) and version:
                versions.append(version)
            else:
                raise ValueError(f"a version is a number or a non-empty string, not {version!r}")
        return tuple(versions)


class VersionPolicy(BaseModel):
    """Which of a model's versions are served: Triton's ``version_policy``, exactly one of
    ``{"latest": {"num_versions": N}}``, ``{"all": {}}``, ``{"specific": {"versions": [...]}}``.
    A model without one serves all its versions (MLServer's behaviour)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latest: LatestVersions | None = None
    all: AllVersions | None = None
    specific: SpecificVersions | None = None

    @model_validator(mode="after")
    def _one_choice(self) -> VersionPolicy:
        chosen = [name for name in ("latest", "all", "specific") if getattr(self, name) is not None]
        if len(chosen) != 1:
            given = " and ".join(chosen) if chosen else "none"
            raise ValueError(f"give exactly one of latest, all or specific (given: {given})")
        return self


class WarmupInput(BaseModel):
    """One input of a warm-up sample: ``data`` is ``"zero"``, ``"random"`` (seeded: the same
    values on every load) or the values themselves, as a V2 JSON request carries them."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    datatype: str
    # Generated data: a -1 first dimension is the sample's batch_size, any other -1 is 1.
    shape: list[StrictInt]
    data: Literal["zero", "random"] | list[Any]
    parameters: dict[str, Any] = Field(default_factory=dict)

    @field_validator("datatype")
    @classmethod
    def _known_datatype(cls, value: str) -> str:
        if value not in DATATYPES:
            raise ValueError(f"unknown datatype {value!r}; expected one of {', '.join(DATATYPES)}")
        return value

    @model_validator(mode="after")
    def _data_fits_shape(self) -> WarmupInput:
        if any(dim < -1 for dim in self.shape):
            raise ValueError(f"input '{self.name}': shape {self.shape} has a dimension below -1")
        if isinstance(self.data, list):
            if -1 in self.shape:
                raise ValueError(
                    f"input '{self.name}': explicit data needs a shape without -1, not {self.shape}"
                )
            declared, given = element_count(tuple(self.shape)), _leaf_count(self.data)
            if declared != given:
                raise ValueError(
                    f"input '{self.name}': shape {self.shape} holds {declared} values, "
                    f"data has {given}"
                )
        return self


class WarmupSample(BaseModel):
    """A warm-up request run ``count`` times on each replica before it is READY: generated
    ``inputs`` (the model's declared inputs with zeros when omitted) or a ``request_file``,
    a V2 JSON inference request in the model's folder (docs/warmup.md)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    count: StrictInt = Field(1, ge=1, le=1000)
    batch_size: StrictInt = Field(1, ge=1, le=65536)
    inputs: list[WarmupInput] | None = Field(None, min_length=1)
    request_file: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_source(self) -> WarmupSample:
        if self.request_file is None:
            return self
        if self.inputs is not None:
            raise ValueError(f"warm-up '{self.name}': give inputs or a request_file, not both")
        if self.batch_size != 1:
            raise ValueError(
                f"warm-up '{self.name}': batch_size applies to generated inputs; a request "
                "file holds its own shapes"
            )
        path = Path(self.request_file)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError(
                f"warm-up '{self.name}': request_file {self.request_file!r} must be a path "
                "inside the model's folder"
            )
        return self


def _leaf_count(data: list[Any]) -> int:
    """The values in nested lists (without recursion: nesting depth is the file's)."""
    count, pending = 0, [data]
    while pending:
        for item in pending.pop():
            if isinstance(item, list):
                pending.append(item)
            else:
                count += 1
    return count


class ModelSettings(BaseModel):
    """One model: read from its folder's ``model-settings.json``, or inferred from its files."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    name: str
    implementation: str | None = None
    runtime: str | None = None
    parameters: ModelParameters = Field(default_factory=ModelParameters)
    inputs: list[dict[str, Any]] = Field(default_factory=list)
    outputs: list[dict[str, Any]] = Field(default_factory=list)
    # Batching (engine/worker/batching.py, docs/batching.md). max_batch_size: most rows
    # per predict; 0 (unset): batch queued requests, up to 256 rows, when the runtime's
    # rows are independent; 1 (or negative, which MLServer accepts): never batch.
    # max_batch_time: seconds a request may wait for others (MLServer's adaptive
    # batching); 0: take what is queued, never wait.
    max_batch_size: int = 0
    max_batch_time: float = Field(0.0, ge=0, allow_inf_nan=False)
    replicas: int | None = None
    # Seconds one predict may run (504, worker recycled); None: the server's model_timeout.
    timeout: float | None = None
    # MiB one call of the model may allocate in its worker (a MemoryError past it: 500);
    # None: only the worker's limit (engine/worker/memory_limit.py, docs/operate/memory.md).
    max_memory: int | None = Field(None, gt=0)
    # Which versions of the model are served (None: all); repository.discover applies it.
    version_policy: VersionPolicy | None = None
    # Requests run on each replica after it loads, before it is READY (worker/warmup.py).
    warmup: list[WarmupSample] = Field(default_factory=list)
    # What the workers holding it must offer: tags, or packages with versions
    # (``lightgbm>=4.0``); engine/environments/capabilities.py, docs/environments.md.
    requirements: list[str] = Field(default_factory=list)
    # A pipeline of other models instead of an artefact (engine/pipelines, docs/pipelines.md).
    pipeline: PipelineSpec | None = None
    folder: Path | None = None

    @field_validator("requirements")
    @classmethod
    def _valid_requirements(cls, requirements: list[str]) -> list[str]:
        from inferpool.engine.environments.capabilities import check_requirements

        check_requirements(requirements)
        return requirements

    @field_validator("warmup")
    @classmethod
    def _distinct_warmup_names(cls, samples: list[WarmupSample]) -> list[WarmupSample]:
        # A failing sample is named in the model's reason: the name must say which.
        names = [sample.name for sample in samples]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"warm-up sample names must differ: {', '.join(repeated)} repeated")
        return samples

    @property
    def version(self) -> str | None:
        return self.parameters.version

    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec.from_dict(spec) for spec in self.inputs]

    def output_specs(self) -> list[TensorSpec]:
        return [TensorSpec.from_dict(spec) for spec in self.outputs]

    def resolve(self, relative: str) -> Path:
        """A path from the settings file, relative to the model's folder."""
        path = Path(relative)
        if not path.is_absolute() and self.folder is not None:
            path = self.folder / path
        return path


def read_model_settings(folder: Path, default_name: str) -> ModelSettings:
    """The settings of the model in ``folder``; ``ValueError`` with a one-line reason."""
    raw: dict[str, Any] = {}
    path = folder / MODEL_SETTINGS_FILE
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: must hold a JSON object")
        check_model_keys(raw, str(path))
        raw = with_model_environment(raw, os.environ)
    raw.setdefault("name", default_name)
    raw["folder"] = folder
    try:
        return ModelSettings(**raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{path}: {where}: {first['msg']}") from None
