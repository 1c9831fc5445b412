"""What each REST route answers, as the OpenAPI documents describe it: one ``Op`` per route
path and method.

``OPERATIONS`` is keyed by the route's path as the app declares it, a model route under
``{model}`` (which stands for ``/v2/models/{name}`` and ``/v2/models/{name}/versions/
{version}`` alike). ``openapi.py`` walks the app's routes and describes each through this
table; tests/unit/frontends/test_openapi.py fails for a route without a line here, so the
document cannot leave an endpoint out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

JSON = "application/json"
EVENTS = "text/event-stream"
HTML = "text/html"
TEXT = "text/plain"

# What each error status means in a description.
ERRORS = {
    400: "bad request",
    401: "no or wrong admin token",
    403: "the repository API is off",
    404: "unknown model or version",
    405: "method not allowed",
    413: "body too large",
    415: "unsupported content type",
    500: "the model raised",
    501: "not installed",
    503: "not ready, or overloaded (may carry Retry-After)",
    504: "deadline exceeded",
}
_MODEL = (400, 404, 503)
_INFER = (400, 404, 413, 500, 503, 504)
_ADMIN = (400, 401, 403, 404, 500, 503)


@dataclass(frozen=True)
class Op:
    """One operation: what it does, its group, the schema (``COMPONENTS``) of its 200
    answer and of its request body, the answer's media type, and its errors. An answer of
    None is any content of ``media``, ``""`` an empty answer; a body of None is none, ``""``
    any content."""

    summary: str
    tag: str
    answer: str | None
    body: str | None = None
    media: str = JSON
    errors: tuple[int, ...] = _MODEL
    # Health answers 503 with its own document (the flag false, the reason), not Error.
    health: bool = False
    # The request body may be left out (tritonclient's empty repository index request).
    optional_body: bool = False


_INDEX = Op(
    "The repository's models and their states (V2 repository extension)",
    "repository",
    "RepositoryIndexResponse",
    body="RepositoryIndexRequest",
    optional_body=True,
    errors=(400, 413),
)
_DOCUMENT = Op("This OpenAPI document", "docs", "OpenAPIDocument", errors=(404,))
_SWAGGER = Op("Swagger UI over this document", "docs", None, media=HTML, errors=(404, 501))
# At the root for a server of one model, and under every model.
_INVOCATIONS = Op(
    "MLflow's scoring request (JSON or CSV): inference",
    "mlflow",
    None,
    body="",
    errors=(400, 404, 415, 500, 503),
)
_MLFLOW_PING = Op("MLflow scoring server: liveness", "mlflow", None, media=TEXT, errors=())
# Triton's trace and logging extensions: read by GET, changed by POST (the admin token).
_SETTINGS_ERRORS = (400, 401, 404)
_TRACE = Op("Trace settings (Triton's trace extension)", "settings", "TraceSettings",
            body="TraceSettings", errors=_SETTINGS_ERRORS)  # fmt: skip
_LOGGING = Op("Log settings (Triton's logging extension)", "settings", "LogSettings",
              body="LogSettings", errors=_SETTINGS_ERRORS)  # fmt: skip

# Triton's system shared-memory extension (frontends/rest/shm_routes.py); CUDA's answers 400.
_SHM_STATUS = Op("Registered system shared-memory regions", "shared memory",
                 "SharedMemoryStatus", errors=(400,))  # fmt: skip
_SHM_UNREGISTER = Op("Unregister system shared memory", "shared memory", "", errors=(400,))
_CUDA = Op("CUDA shared memory: not supported (400)", "shared memory", None, errors=(400,))
_CUDA_POST = replace(_CUDA, body="")

OPERATIONS: dict[str, dict[str, Op]] = {
    "/v2/health/live": {
        "get": Op("Server liveness", "health", "LiveResponse", errors=(503,), health=True)
    },
    "/v2/health/ready": {
        "get": Op(
            "Server readiness (strict)", "health", "ReadyResponse", errors=(503,), health=True
        )
    },
    "/v2": {"get": Op("Server metadata", "metadata", "MetadataServerResponse", errors=())},
    "/v2/models/stats": {
        "get": Op("Every model's statistics", "statistics", "Statistics", errors=())
    },
    "/v2/repository/index": {"get": _INDEX, "post": _INDEX},
    "/v2/repository/models/{name}/load": {
        "post": Op("Load or reload a model", "repository", "", errors=_ADMIN)
    },
    "/v2/repository/models/{name}/unload": {
        "post": Op("Unload a model", "repository", "", errors=_ADMIN)
    },
    "/v2/docs": {"get": _SWAGGER},
    "/v2/docs/dataplane.json": {"get": _DOCUMENT},
    "{model}": {"get": Op("Model metadata", "metadata", "MetadataModelResponse", errors=(404,))},
    "{model}/ready": {
        "get": Op("Model readiness", "health", "ModelReadyResponse", errors=(404, 503), health=True)
    },
    "{model}/infer": {
        "post": Op(
            "Inference (V2 JSON; Triton's binary tensor extension too)",
            "inference",
            "InferenceResponse",
            body="InferenceRequest",
            errors=_INFER,
        )
    },
    "{model}/stats": {
        "get": Op("The model's statistics", "statistics", "Statistics", errors=(404,))
    },
    "{model}/config": {
        "get": Op("The model's configuration (Triton's shape)", "metadata", "ModelConfig")
    },
    "{model}/docs": {"get": _SWAGGER},
    "{model}/docs/dataplane.json": {"get": _DOCUMENT},
    "{model}/infer_stream": {
        "post": Op(
            "Streamed inference: one Server-Sent Event per V2 response",
            "inference",
            None,
            body="InferenceRequest",
            media=EVENTS,
            errors=_INFER,
        )
    },
    "{model}/generate_stream": {
        "post": Op(
            "The generate extension, streamed as Server-Sent Events",
            "generate",
            None,
            body="GenerateRequest",
            media=EVENTS,
            errors=_INFER,
        )
    },
    "{model}/generate": {
        "post": Op(
            "The generate extension",
            "generate",
            "GenerateResponse",
            body="GenerateRequest",
            errors=_INFER,
        )
    },
    "{model}/feedback": {
        "post": Op(
            "Feedback (a reward and the truth) for the model's runtime",
            "custom",
            "Parameters",
            body="FeedbackRequest",
            errors=_INFER,
        )
    },
    "/v2/trace/setting": {"get": replace(_TRACE, body=None), "post": _TRACE},
    "{model}/trace/setting": {"get": replace(_TRACE, body=None), "post": _TRACE},
    "/v2/logging": {"get": replace(_LOGGING, body=None), "post": _LOGGING},
    "/v2/systemsharedmemory/status": {"get": _SHM_STATUS},
    "/v2/systemsharedmemory/region/{name}/status": {"get": _SHM_STATUS},
    "/v2/systemsharedmemory/region/{name}/register": {
        "post": Op(
            "Register a system shared-memory region",
            "shared memory",
            "",
            body="SharedMemoryRegister",
            errors=(400, 413),
        )
    },
    "/v2/systemsharedmemory/region/{name}/unregister": {"post": _SHM_UNREGISTER},
    "/v2/systemsharedmemory/unregister": {"post": _SHM_UNREGISTER},
    "/v2/cudasharedmemory/status": {"get": _CUDA},
    "/v2/cudasharedmemory/region/{name}/status": {"get": _CUDA},
    "/v2/cudasharedmemory/region/{name}/register": {"post": _CUDA_POST},
    "/v2/cudasharedmemory/region/{name}/unregister": {"post": _CUDA_POST},
    "/v2/cudasharedmemory/unregister": {"post": _CUDA_POST},
    # KServe's V1 protocol (frontends/rest/kserve_v1.py).
    "/": {"get": Op("KServe V1: server liveness", "v1", "V1Alive", errors=())},
    "/v1/models": {"get": Op("KServe V1: the models", "v1", "V1Models", errors=())},
    "/v1/models/{name}": {
        "get": Op("KServe V1: model readiness", "v1", "V1ModelReady", errors=(404, 503))
    },
    "/v1/models/{name}:predict": {
        "post": Op(
            "KServe V1: predictions for instances",
            "v1",
            "V1Predictions",
            body="V1Request",
            errors=_INFER,
        )
    },
    "/v1/models/{name}:explain": {
        "post": Op(
            "KServe V1: explanations for instances",
            "v1",
            "V1Explanations",
            body="V1Request",
            errors=_INFER,
        )
    },
    "/ping": {"get": _MLFLOW_PING},
    "/health": {"get": _MLFLOW_PING},
    "/version": {"get": Op("MLflow scoring server: the version", "mlflow", None, errors=(404,))},
    "/invocations": {"post": _INVOCATIONS},
    "/metrics": {"get": Op("Prometheus metrics", "metrics", None, media=TEXT, errors=())},
}

# Every model's own endpoints (``frontends/endpoints.py``), under ``{model}/``.
EVERY_MODEL: dict[str, Op] = {
    "explain": Op(
        "Per-feature attributions of the model's score for a V2 request's rows (or the "
        "answer of the explainer model its parameters.extra.explainer names)",
        "inference",
        "InferenceResponse",
        body="InferenceRequest",
        errors=_INFER,
    ),
    "invocations": _INVOCATIONS,
}
# A runtime's own endpoint, described in the model's document by its path and methods.
CUSTOM = Op("A custom endpoint of the model's runtime", "custom", None, body="", media="*/*")
