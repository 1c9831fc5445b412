"""MLServer's model settings contract, mapped onto inferpool's ModelSettings.

Owns the table of MLServer 1.7.1's ModelSettings and ModelParameters fields
(``model-settings.json`` keys and their ``MLSERVER_MODEL_*`` variables): each is read as
it is, or refused with a stated reason: a warning when its value changes nothing served,
else that model fails with the reason. Unknown keys are warnings naming the key and file.

The model variables (``MLSERVER_MODEL_*``, and ``INFERPOOL_MODEL_*`` which win) fill the
keys a ``model-settings.json`` leaves out, as MLServer reads its files; in a repository
with no such file they describe its one model (single-model mode, as KServe's MLServer
runtime uses it), its artefact at the URI or at the repository's root
(``inferpool.settings.loading.single_model`` builds that model's settings).

It imports nothing of ``inferpool.settings``: the settings package reads MLServer's keys
through it, so this side stays below it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferpool.mlserver.contract.common import parse_env, warn_once

MODEL_PREFIX = "MLSERVER_MODEL_"
OUR_MODEL_PREFIX = "INFERPOOL_MODEL_"
ENVIRONMENT_MODEL = "environment (MLSERVER_MODEL_* / INFERPOOL_MODEL_*)"

# MLServer 1.7.1's ModelSettings and ModelParameters fields that inferpool reads as they are.
MODEL_SUPPORTED = frozenset(
    {
        "name",
        "implementation",
        "inputs",
        "outputs",
        "max_batch_size",
        "max_batch_time",
        "parameters",
    }
)
# environment_tarball / environment_path: the model's replicas run in workers started with
# that environment's interpreter (engine/environments/unpack.py, engine/pool/groups.py);
# format: the pyspark.mllib model class of mlserver_mllib.MLlibModel (runtimes/mllib.py).
PARAMETERS_SUPPORTED = frozenset(
    {"uri", "version", "content_type", "extra", "environment_tarball", "environment_path", "format"}
)
# inferpool's own model-settings keys.
MODEL_OURS = frozenset(
    {
        "runtime",
        "replicas",
        "timeout",
        "version_policy",
        "warmup",
        "pipeline",
        "requirements",
        "max_memory",
    }
)
# inferpool's own parameters keys (an explainer's model: ``runtimes/explainer.py``).
PARAMETERS_OURS = frozenset({"explains"})

_POOLS = "inferpool places models on its shared workers (set replicas instead)"


@dataclass(frozen=True, slots=True)
class Refused:
    """A model setting inferpool does not implement. Its MLServer default is silent; any
    other value is a warning, or fails the model when ``fails``."""

    reason: str
    default: Any = None
    fails: bool = False
    # Read by an MLModel runtime's own metadata() (MLServer's settings reach it), so the
    # warning must not say "ignored" for every model.
    mlmodel_reads: bool = False


MODEL_REFUSED: dict[str, Refused] = {
    "platform": Refused("the model metadata gives the runtime's platform", "", mlmodel_reads=True),
    "versions": Refused("the model metadata lists the served versions", [], mlmodel_reads=True),
    "parallel_workers": Refused("deprecated by MLServer; set the server's workers"),
    "warm_workers": Refused("deprecated by MLServer; workers are always warm", False),
    "cache_enabled": Refused("inferpool caches no responses: every request is predicted", False),
}
PARAMETERS_REFUSED: dict[str, Refused] = {
    "inference_pool_gid": Refused(_POOLS),
    "autogenerate_inference_pool_gid": Refused(_POOLS, False),
}


def check_model_keys(raw: Mapping[str, Any], where: str) -> None:
    """Warn about unknown and harmless refused keys; ``ValueError`` for a fatal one."""
    parameters = raw.get("parameters")
    checks: list[tuple[str, Any, frozenset[str], dict[str, Refused]]] = [
        (key, value, MODEL_SUPPORTED | MODEL_OURS, MODEL_REFUSED) for key, value in raw.items()
    ]
    if isinstance(parameters, Mapping):
        checks += [
            (f"parameters.{key}", value, PARAMETERS_SUPPORTED | PARAMETERS_OURS, PARAMETERS_REFUSED)
            for key, value in parameters.items()
        ]
    for shown, value, supported, refused in checks:
        key = shown.rpartition(".")[2]
        if key in supported:
            continue
        if key in refused:
            rule = refused[key]
            if value == rule.default or (rule.fails and not value):
                continue  # what MLServer does without it, and what inferpool does
            if rule.fails:
                raise ValueError(f"{where}: {shown}={value!r} is not implemented: {rule.reason}")
            if rule.mlmodel_reads:
                warn_once(
                    f"{where}: {shown}={value!r} is read by MLModel runtimes only (their "
                    f"metadata(), as in MLServer); inferpool's own runtimes ignore it: "
                    f"{rule.reason}"
                )
                continue
            warn_once(f"{where}: {shown}={value!r} is not implemented ({rule.reason}); ignored")
        else:
            warn_once(f"{where}: unknown key '{shown}'")


# Model variables: MLServer's ModelSettings and ModelParameters fields, and inferpool's own.
_MODEL_FIELDS = {
    "name": str,
    "implementation": str,
    "runtime": str,
    "platform": str,
    "versions": list,
    "inputs": list,
    "outputs": list,
    "parallel_workers": int,
    "warm_workers": bool,
    "max_batch_size": int,
    "max_batch_time": float,
    "parameters": dict,
    "cache_enabled": bool,
    "replicas": int,
}
_PARAMETER_FIELDS = {
    "uri": str,
    "version": str,
    "environment_path": str,
    "environment_tarball": str,
    "inference_pool_gid": str,
    "autogenerate_inference_pool_gid": bool,
    "format": str,
    "content_type": str,
    "extra": dict,
}


def is_model_variable(name: str) -> bool:
    field = name[len(MODEL_PREFIX) :].lower() if name.startswith(MODEL_PREFIX) else ""
    return field in _MODEL_FIELDS or field in _PARAMETER_FIELDS


def model_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The model described by ``MLSERVER_MODEL_*`` / ``INFERPOOL_MODEL_*`` (which win)."""
    raw: dict[str, Any] = {}
    parameters: dict[str, Any] = {}
    for prefix in (MODEL_PREFIX, OUR_MODEL_PREFIX):  # the later one wins
        for field, kind in (_MODEL_FIELDS | _PARAMETER_FIELDS).items():
            text = environ.get(prefix + field.upper())
            if text is None:
                continue
            value = parse_env(text, kind)
            if field == "parameters" and isinstance(value, dict):
                parameters.update(value)
            elif field in _PARAMETER_FIELDS:
                parameters[field] = value
            else:
                raw[field] = value
    if parameters.get("uri"):
        # MLServer reads a relative URI from where it runs, not from a model's folder.
        parameters["uri"] = str(Path(parameters["uri"]).absolute())
    if parameters:
        raw["parameters"] = parameters
    return raw


def with_model_environment(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """A model-settings file's keys over the environment's model keys, as MLServer reads
    every model-settings.json (e.g. KServe's MLSERVER_MODEL_NAME names a model whose file
    gives no name; its MLSERVER_MODEL_IMPLEMENTATION never replaces the file's)."""
    defaults = model_environment(environ)
    if not defaults:
        return raw
    check_model_keys(defaults, ENVIRONMENT_MODEL)
    parameters = raw.get("parameters")
    merged = {**defaults, **raw}
    if isinstance(parameters, dict) and "parameters" in defaults:
        merged["parameters"] = {**defaults["parameters"], **parameters}
    return merged


def single_model_repository(environ: Mapping[str, str]) -> Path | None:
    """The folder of the environment's model's URI: the repository when none is named."""
    uri = model_environment(environ).get("parameters", {}).get("uri")
    if not uri:
        return None
    path = Path(uri).absolute()
    return path if path.is_dir() else path.parent
