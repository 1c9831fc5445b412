"""The flags of ``inferpool serve``, generated from ServerSettings: one per field, grouped
by concern, each with its default, its ``INFERPOOL_*`` variable and, where MLServer has
the setting, its ``MLSERVER_*`` variable. The help is formatted by rich-argparse.

Flags carry text: pydantic converts and checks every value (inferpool.settings stays
the one place that says what is allowed), and ``cli_errors`` words its refusals.
"""

from __future__ import annotations

import argparse
import json
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from inferpool.mlserver.contract.server_settings import SERVER_PREFIX, SERVER_RULES
from inferpool.settings import ServerSettings

# The help's sections, in their order: (title, what they hold).
GROUPS: dict[str, str] = {
    "repository": "where the models come from, and the repository API that loads them",
    "network": "addresses and ports of the REST, gRPC and metrics servers",
    "workers": "the worker processes that run the models",
    "limits": "what one request or connection may use; each is checked before anything is\n"
    "allocated, and a request over one is refused (HTTP 4xx, gRPC status)",
    "lifecycle": "start-up, readiness and shutdown",
    "observability": "logs, metrics and traces",
    "security": "TLS on the REST and gRPC ports, and the API keys inference calls must carry\n"
    "(docs/operate/security.md)",
    "compatibility": "MLServer's settings: settings.json and the MLSERVER_* variables are read\n"
    "as MLServer reads them (docs/migrating-from-mlserver.md)",
}

# Every ServerSettings field, and the help section its flag is listed in.
# A NEW SETTING NEEDS A LINE HERE: tests/unit/test_cli_flags.py fails for a field without
# one, so that no flag lands in no section. Keep the lines in the order of the help.
FIELD_GROUPS: dict[str, str] = {
    # repository
    "model_repository": "repository",
    "model_control_mode": "repository",
    "repository_debounce": "repository",
    "storage_cache_dir": "repository",
    "storage_max_size": "repository",
    "storage_timeout": "repository",
    "storage_poll_interval": "repository",
    "load_models_at_startup": "repository",
    "admin_token": "repository",
    "admin_token_file": "repository",
    # security
    "tls_certificate": "security",
    "tls_key": "security",
    "tls_client_ca": "security",
    "api_keys_file": "security",
    # network
    "host": "network",
    "http_port": "network",
    "grpc_port": "network",
    "grpc_implementation": "network",
    "grpc_reflection": "network",
    "grpc_stream_response": "compatibility",
    "metrics_port": "network",
    "http2": "network",
    # workers
    "workers": "workers",
    "max_queue": "workers",
    "worker_memory_limit": "workers",
    "worker_heartbeat_timeout": "workers",
    "worker_tags": "workers",
    "worker_groups": "workers",
    "environment_workers": "workers",
    "environments_dir": "workers",
    "environment_tarball": "workers",
    "worker_max_requests": "workers",
    "worker_max_rss": "workers",
    "stall_threshold": "workers",
    "max_standby_workers": "workers",
    # limits
    "max_body_bytes": "limits",
    "max_tensor_elements": "limits",
    "max_request_tensor_bytes": "limits",
    "max_json_depth": "limits",
    "max_shared_memory_regions": "limits",
    "max_header_bytes": "limits",
    "max_header_count": "limits",
    "max_concurrent_streams": "limits",
    "max_connections": "limits",
    "handshake_timeout": "limits",
    "idle_timeout": "limits",
    "header_timeout": "limits",
    "body_timeout": "limits",
    "write_timeout": "limits",
    "request_timeout": "limits",
    "model_timeout": "limits",
    "model_load_timeout": "limits",
    "max_unsent_bytes": "limits",
    "max_unsent_bytes_per_connection": "limits",
    "rate_limit": "limits",
    "rate_limit_burst": "limits",
    # lifecycle
    "exit_on_error": "lifecycle",
    "allow_empty": "lifecycle",
    "shutdown_timeout": "lifecycle",
    "drain_delay": "lifecycle",
    "load_probe": "lifecycle",
    # observability
    "log_level": "observability",
    "log_format": "observability",
    "log_levels": "observability",
    "access_log": "observability",
    "metrics_latency_buckets": "observability",
    "metrics_batch_buckets": "observability",
    "tracing": "observability",
    # compatibility
    "cors_settings": "compatibility",
    "cloudevents": "compatibility",
    "gzip_enabled": "network",
    "grpc_response_gzip": "network",
    "gzip_min_bytes": "network",
    "gzip_level": "network",
}

# Settings whose default is computed where the server starts: shown in words.
_DEFAULT_WORDS = {
    "workers": "the number of CPU cores",
    "environments_dir": "$XDG_CACHE_HOME/inferpool/environments",
    "storage_cache_dir": "$XDG_CACHE_HOME/inferpool/storage",
}


def flag(name: str) -> str:
    """The command-line flag of the setting ``name``."""
    return "--" + name.replace("_", "-")


def mlserver_names() -> dict[str, str]:
    """ServerSettings field -> the MLServer setting that sets it as it is (its key in
    settings.json; ``MLSERVER_`` + the key upper-cased is its variable)."""
    names: dict[str, str] = {}
    probe = object()
    for key, rule in SERVER_RULES.items():
        if rule.convert is None:
            continue
        try:
            converted = rule.convert(probe)
        except Exception:  # a rule that reads the value (metrics_endpoint) is no rename
            continue
        # One field set to the value itself; MLSERVER_DEBUG, say, sets two settings.
        if len(converted) == 1:
            ((field, value),) = converted.items()
            if value is probe:
                names.setdefault(field, key)
    return names


def default_text(name: str, field: FieldInfo) -> str:
    """The default of setting ``name`` as a user would write it."""
    if name in _DEFAULT_WORDS:
        return _DEFAULT_WORDS[name]
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(str(item) for item in value) if value else "none"
    if isinstance(value, dict):
        return json.dumps(value) if value else "none"
    return str(value)


def help_text(name: str, field: FieldInfo, mlserver: dict[str, str]) -> str:
    """A flag's help: what it does, its default, the variables that set it."""
    description = (field.description or "").removesuffix(".")
    variables = f"INFERPOOL_{name.upper()}"
    if name in mlserver:
        variables += f", {SERVER_PREFIX}{mlserver[name].upper()}"
    # Parentheses, not brackets: rich-argparse reads [...] as markup.
    text = f"{description} (default: {default_text(name, field)}; env: {variables})"
    return text.replace("%", "%%")  # argparse expands %(...)s in help


def _is_structured(annotation: Any) -> bool:
    kinds = typing.get_args(annotation) or (annotation,)
    if any(isinstance(k, type) and issubclass(k, BaseModel) for k in kinds):
        return True
    return typing.get_origin(annotation) is list and _is_structured(typing.get_args(annotation)[0])


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"not valid JSON: {text!r}") from None


def setting_groups(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The help's sections (argument groups) of ``parser``, by name."""
    return {
        name: parser.add_argument_group(name.capitalize(), about) for name, about in GROUPS.items()
    }


def add_setting_flags(groups: dict[str, Any]) -> None:
    """One flag per ServerSettings field (but the repository, an argument the caller adds),
    each in its group (``setting_groups``)."""
    mlserver = mlserver_names()
    for name in FIELD_GROUPS:
        field = ServerSettings.model_fields[name]
        if name == "model_repository":
            continue
        group = groups[FIELD_GROUPS[name]]
        help_ = help_text(name, field, mlserver)
        if field.annotation is bool:
            group.add_argument(
                flag(name),
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_,
            )
            continue
        # Text, as from the environment: pydantic converts and checks it. Structured
        # settings (cors_settings, worker_groups) are JSON, as in the environment.
        kind = _json_value if _is_structured(field.annotation) else str
        group.add_argument(
            flag(name), dest=name, type=kind, default=argparse.SUPPRESS, metavar=_metavar(field),
            help=help_,
        )  # fmt: skip


def _metavar(field: FieldInfo) -> str:
    annotation = field.annotation
    choices = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()
    if choices:
        return "{" + ",".join(choices) + "}"
    if annotation is int:
        return "N"
    if annotation is float:
        # Every float setting is a duration, but a rate ("requests per second").
        rate = field.description is not None and "per second" in field.description
        return "PER_SECOND" if rate else "SECONDS"
    if annotation in (Path, Path | None):
        return "PATH"
    if _is_structured(annotation):
        return "JSON"
    return "TEXT"
