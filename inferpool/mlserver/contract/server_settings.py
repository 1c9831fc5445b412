"""MLServer's server settings contract, mapped onto inferpool's ServerSettings.

Owns the table of MLServer 1.7.1's server settings (``settings.json`` keys and their
``MLSERVER_*`` variables, CORS keys included): each is mapped to inferpool's equivalent or
refused with a stated reason. A refused setting whose value changes nothing served is a
warning naming it; one that would make inferpool serve differently from MLServer stops the
start (SettingsRefused). Unknown keys and variables are warnings. The model settings'
side is ``model_settings``, beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from inferpool.mlserver.contract.common import parse_env, warn_once
from inferpool.mlserver.contract.cors import CORSSettings
from inferpool.mlserver.contract.model_settings import is_model_variable

SERVER_PREFIX = "MLSERVER_"
MODELS_DIR = "MLSERVER_MODELS_DIR"  # the folder MLServer's image serves (its CMD argument)
ENV_TARBALL = "MLSERVER_ENV_TARBALL"  # the environment MLServer's image unpacks first


class SettingsRefused(ValueError):
    """A setting inferpool does not implement, whose absence would change what it serves."""


@dataclass(frozen=True, slots=True)
class Rule:
    """What inferpool does with one MLServer setting.

    ``convert`` maps a value to inferpool settings (an empty dict: the value is what
    inferpool does anyway). Without ``convert`` the setting is refused for ``reason``:
    a warning, unless ``fatal(value)`` says serving without it would differ (an error).
    """

    kind: Any
    convert: Callable[[Any], dict[str, Any]] | None = None
    reason: str = ""
    fatal: Callable[[Any], bool] | None = None


def _to(field: str) -> Callable[[Any], dict[str, Any]]:
    return lambda value: {field: value}


def _unless_none(field: str) -> Callable[[Any], dict[str, Any]]:
    return lambda value: {} if value is None else {field: value}


# gRPC's largest message: what a negative grpc_max_message_length (gRPC's "unlimited", which
# ModelMesh's MLServer runtime sets) stands for.
UNLIMITED_MESSAGE = 2**31 - 1


def _message_length(value: int | None) -> dict[str, Any]:
    if value is None:
        return {}
    return {"max_body_bytes": UNLIMITED_MESSAGE if value < 0 else value}


def _debug(value: bool) -> dict[str, Any]:
    # MLServer's debug: DEBUG log level and uvicorn's access log.
    return {"log_level": "debug" if value else "info", "access_log": value}


def _metrics_endpoint(value: str | None) -> dict[str, Any]:
    if not value:
        return {"metrics_port": -1}  # MLServer: no metrics server (0 would serve them on REST)
    if value != "/metrics":
        raise SettingsRefused(
            f"{value!r} is not implemented: inferpool serves Prometheus metrics at /metrics only"
        )
    return {}


class _Warn(Exception):
    """A value that inferpool does not implement but that changes nothing served."""


_OPT_STR = str | None

# MLServer 1.7.1's Settings fields (env prefix MLSERVER_), in its order.
SERVER_RULES: dict[str, Rule] = {
    "debug": Rule(bool, _debug),
    "parallel_workers": Rule(int, _to("workers")),
    "parallel_workers_timeout": Rule(
        int, reason="inferpool drains requests for shutdown_timeout, then stops its workers"
    ),
    "environments_dir": Rule(str, _to("environments_dir")),
    "model_repository_implementation": Rule(
        _OPT_STR,
        reason="inferpool reads model repositories in folders only; a custom repository "
        "class is not loaded",
        fatal=lambda v: v is not None,
    ),
    "model_repository_root": Rule(str, _to("model_repository")),
    "model_repository_implementation_args": Rule(
        dict, reason="arguments of a custom repository class, which inferpool does not load"
    ),
    "load_models_at_startup": Rule(bool, _to("load_models_at_startup")),
    "server_name": Rule(str, reason="the server metadata names inferpool"),
    "server_version": Rule(str, reason="the server metadata gives inferpool's version"),
    "extensions": Rule(
        list[str], reason="the server metadata lists the extensions inferpool implements"
    ),
    "host": Rule(str, _to("host")),
    "http_port": Rule(int, _to("http_port")),
    "root_path": Rule(
        str,
        reason="the REST routes are served at /; serve behind a proxy that strips the prefix",
        fatal=lambda v: bool(v),
    ),
    "grpc_port": Rule(int, _to("grpc_port")),
    "grpc_max_message_length": Rule(int | None, _message_length),
    "cors_settings": Rule(dict | None, _to("cors_settings")),
    "metrics_endpoint": Rule(_OPT_STR, _metrics_endpoint),
    "metrics_port": Rule(int, _to("metrics_port")),
    "metrics_rest_server_prefix": Rule(str, reason="inferpool's metric names are its own"),
    "metrics_dir": Rule(
        str, reason="inferpool's workers report metrics to the server process; no folder"
    ),
    "use_structured_logging": Rule(bool, lambda v: {"log_format": "json" if v else "text"}),
    "logging_settings": Rule(
        str | dict | None,
        reason="inferpool's logging is set by log_format, log_level and log_levels instead",
    ),
    "kafka_enabled": Rule(bool, reason="inferpool has no Kafka server", fatal=lambda v: bool(v)),
    "kafka_servers": Rule(str, reason="inferpool has no Kafka server"),
    "kafka_topic_input": Rule(str, reason="inferpool has no Kafka server"),
    "kafka_topic_output": Rule(str, reason="inferpool has no Kafka server"),
    "tracing_server": Rule(
        _OPT_STR,
        reason="inferpool's tracing is set by tracing and OpenTelemetry's OTEL_* variables "
        "(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://<tracing_server>) instead",
    ),
    "cache_enabled": Rule(bool, reason="inferpool caches no responses: every request is predicted"),
    "cache_size": Rule(int, reason="inferpool caches no responses"),
    "gzip_enabled": Rule(bool, _to("gzip_enabled")),
}


# -- server settings -------------------------------------------------------------------------
def server_values(
    raw: Mapping[str, Any],
    ours: Iterable[str],
    where: str,
    label: Callable[[str], str] = str,
) -> dict[str, Any]:
    """``raw`` (MLServer's or inferpool's keys) as inferpool's ServerSettings values.

    ``where`` names the file or says "environment", ``label`` how a key is shown there;
    unknown keys are warnings naming both.
    """
    known = set(ours)
    values: dict[str, Any] = {}
    mapped: dict[str, Any] = {}
    for key, value in raw.items():
        shown = f"{where}: {label(key)}"
        if key in known:
            values[key] = value
        elif key in SERVER_RULES:
            mapped.update(_apply(value, SERVER_RULES[key], shown))
        else:
            warn_once(f"{shown}: unknown setting (neither inferpool's nor MLServer's)")
    for cors in (values.get("cors_settings"), mapped.get("cors_settings")):
        if isinstance(cors, dict):
            _warn_unknown_cors(cors, where)
    return {**mapped, **values}  # inferpool's own key wins over MLServer's in one source


def _apply(value: Any, rule: Rule, shown: str) -> dict[str, Any]:
    try:
        value = TypeAdapter(rule.kind).validate_python(value)
    except ValidationError as exc:
        raise SettingsRefused(f"{shown}={value!r}: {exc.errors()[0]['msg']}") from None
    if rule.convert is not None:
        try:
            return rule.convert(value)
        except _Warn as why:
            warn_once(f"{shown}={value!r} is not implemented: {why}")
            return {}
        except SettingsRefused as exc:
            raise SettingsRefused(f"{shown}: {exc}") from None
    if rule.fatal is not None:
        # Its other values are what inferpool does (no Kafka, routes at /, ...).
        if rule.fatal(value):
            raise SettingsRefused(f"{shown}={value!r} is not implemented: {rule.reason}")
        return {}
    warn_once(f"{shown}={value!r} is not implemented by inferpool ({rule.reason}); ignored")
    return {}


def cors_with_environment(cors: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """``cors`` with the keys it does not give read from ``MLSERVER_<KEY>``, as MLServer's
    CORSSettings does once cors_settings is set."""
    filled = dict(cors)
    for key, field in CORSSettings.model_fields.items():
        text = environ.get(SERVER_PREFIX + key.upper())
        if text is not None and key not in filled:
            filled[key] = parse_env(text, field.annotation)
    return filled


def warn_idle_cors_variables(environ: Mapping[str, str]) -> None:
    """``MLSERVER_ALLOW_ORIGINS``... without cors_settings: no CORS (MLServer's rule too)."""
    for key in CORSSettings.model_fields:
        name = SERVER_PREFIX + key.upper()
        if name in environ:
            warn_once(f"environment: {name} has no effect: cors_settings is not set")


def _warn_unknown_cors(cors: Mapping[str, Any], where: str) -> None:
    for key in cors:
        if key not in CORSSettings.model_fields:
            warn_once(f"{where}: unknown cors_settings key '{key}'")


def environment_values(environ: Mapping[str, str], ours: Iterable[str]) -> dict[str, Any]:
    """The ``MLSERVER_*`` server variables as inferpool's ServerSettings values."""
    raw: dict[str, Any] = {}
    for name, text in environ.items():
        if not name.startswith(SERVER_PREFIX) or name in (MODELS_DIR, ENV_TARBALL):
            continue
        key = name[len(SERVER_PREFIX) :].lower()
        if key in SERVER_RULES:
            raw[key] = parse_env(text, SERVER_RULES[key].kind)
        elif not is_model_variable(name) and not _is_cors_variable(key):
            warn_once(f"environment: unknown variable {name} (not a setting of MLServer 1.7.1)")
    values = server_values(raw, (), "environment", lambda key: SERVER_PREFIX + key.upper())
    models_dir = environ.get(MODELS_DIR)
    if models_dir:
        # MLServer's image runs `mlserver start $MLSERVER_MODELS_DIR`: the argument wins.
        values["model_repository"] = models_dir
    tarball = environ.get(ENV_TARBALL)
    # MLServer's image runs the whole server in it when the file exists (and skips a path
    # that does not exist, which its image sets by default): here every model runs in it.
    if tarball and Path(tarball).is_file():
        values["environment_tarball"] = tarball
    return values


def _is_cors_variable(key: str) -> bool:
    return key in CORSSettings.model_fields
