"""docs/migrating-from-mlserver.md names every setting of MLServer 1.7.1 (issue 13, "Done
when"): each field of its Settings, CORSSettings, ModelSettings and ModelParameters, the
variables KServe sets, and the REST and gRPC endpoints MLServer serves. The names are
facts read from MLServer 1.7.1's mlserver/settings.py, rest/app.py and grpc protos."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferpool.mlserver.contract.model_settings import (
    MODEL_REFUSED,
    MODEL_SUPPORTED,
    PARAMETERS_REFUSED,
    PARAMETERS_SUPPORTED,
)
from inferpool.mlserver.contract.server_settings import SERVER_RULES

DOC = Path(__file__).parents[2] / "docs" / "migrating-from-mlserver.md"

SETTINGS = [
    "debug",
    "parallel_workers",
    "parallel_workers_timeout",
    "environments_dir",
    "model_repository_implementation",
    "model_repository_root",
    "model_repository_implementation_args",
    "load_models_at_startup",
    "server_name",
    "server_version",
    "extensions",
    "host",
    "http_port",
    "root_path",
    "grpc_port",
    "grpc_max_message_length",
    "cors_settings",
    "metrics_endpoint",
    "metrics_port",
    "metrics_rest_server_prefix",
    "metrics_dir",
    "use_structured_logging",
    "logging_settings",
    "kafka_enabled",
    "kafka_servers",
    "kafka_topic_input",
    "kafka_topic_output",
    "tracing_server",
    "cache_enabled",
    "cache_size",
    "gzip_enabled",
]
CORS_SETTINGS = [
    "allow_origins",
    "allow_origin_regex",
    "allow_credentials",
    "allow_methods",
    "allow_headers",
    "expose_headers",
    "max_age",
]
MODEL_SETTINGS = [
    "name",
    "implementation",
    "platform",
    "versions",
    "inputs",
    "outputs",
    "parallel_workers",
    "warm_workers",
    "max_batch_size",
    "max_batch_time",
    "parameters",
    "cache_enabled",
]
MODEL_PARAMETERS = [
    "uri",
    "version",
    "environment_path",
    "environment_tarball",
    "inference_pool_gid",
    "autogenerate_inference_pool_gid",
    "format",
    "content_type",
    "extra",
]
VARIABLES = [
    "MLSERVER_MODEL_NAME",
    "MLSERVER_MODEL_URI",
    "MLSERVER_MODEL_IMPLEMENTATION",
    "MLSERVER_MODEL_VERSION",
    "MLSERVER_MODEL_EXTRA",
    "MLSERVER_HTTP_PORT",
    "MLSERVER_GRPC_PORT",
    "MLSERVER_LOAD_MODELS_AT_STARTUP",
    "MLSERVER_MODELS_DIR",
    "MLSERVER_ENV_TARBALL",
]
REST = [
    "/v2/health/live",
    "/v2/health/ready",
    "/v2/models/{name}",
    "/ready",
    "/infer",
    "/generate",
    "/infer_stream",
    "/generate_stream",
    "/v2/docs",
    "/dataplane.json",
    "/docs",
    "/v2/repository/index",
    "/load",
    "/unload",
]
GRPC = [
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelInfer",
    "ModelStreamInfer",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
    "ModelRepositoryService",
]


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


@pytest.mark.parametrize(
    "name", sorted(set(SETTINGS + CORS_SETTINGS + MODEL_SETTINGS + MODEL_PARAMETERS))
)
def test_every_mlserver_setting_is_in_the_document(doc: str, name: str) -> None:
    assert f"`{name}`" in doc


@pytest.mark.parametrize("name", VARIABLES + REST + GRPC)
def test_every_variable_and_endpoint_is_in_the_document(doc: str, name: str) -> None:
    assert name in doc


def test_the_mapping_covers_every_mlserver_setting() -> None:
    """The code's table and the facts agree: no MLServer setting falls through."""
    assert set(SERVER_RULES) == set(SETTINGS)
    assert MODEL_SUPPORTED | set(MODEL_REFUSED) == set(MODEL_SETTINGS)
    assert PARAMETERS_SUPPORTED | set(PARAMETERS_REFUSED) == set(MODEL_PARAMETERS)
