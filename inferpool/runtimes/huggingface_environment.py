"""The HuggingFace settings a model's environment gives, as MLServer's HuggingFace runtime
reads them: a variable ``MLSERVER_MODEL_HUGGINGFACE_<FIELD>`` per setting (its pydantic
settings' prefix: the value used where ``parameters.extra`` names none), and Seldon Core
v1's ``PREDICTIVE_UNIT_PARAMETERS`` (a JSON list of ``{"name", "value", "type"}``, which
wins over ``parameters.extra``; names that are no setting are ignored, as MLServer does).
Container images built for MLServer's runtime configure their model this way.

Values are typed as MLServer types them: ``model_kwargs`` is JSON, the thread counts
integers, ``optimum_model`` a boolean, ``device`` an integer when it reads as one; a value
that does not parse fails the model in one sentence naming the variable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from inferpool.errors import ModelLoadError

PREFIX = "MLSERVER_MODEL_HUGGINGFACE_"
SELDON_PARAMETERS = "PREDICTIVE_UNIT_PARAMETERS"
_TRUE = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE = frozenset({"0", "false", "no", "off", "n", "f"})


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE | _FALSE:
        return lowered in _TRUE
    raise ValueError(text)


def _device(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(text)
    return value


# MLServer 1.7.1's HuggingFaceSettings fields and how a variable's text becomes each.
_FIELDS: dict[str, Callable[[str], Any]] = {
    "task": str,
    "task_suffix": str,
    "pretrained_model": str,
    "pretrained_tokenizer": str,
    "framework": str,
    "model_kwargs": _json_object,
    "optimum_model": _boolean,
    "device": _device,
    "inter_op_threads": int,
    "intra_op_threads": int,
}
# Seldon Core v1's parameter types (MLServer's EXTRA_TYPE_DICT).
_SELDON_TYPES: dict[str, Callable[[str], Any]] = {
    "INT": int,
    "FLOAT": float,
    "DOUBLE": float,
    "STRING": str,
    "BOOL": _boolean,
}


def settings_from_environment(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The settings ``MLSERVER_MODEL_HUGGINGFACE_*`` variables give (names read in any
    case, as pydantic-settings reads them)."""
    found: dict[str, Any] = {}
    for variable, text in environ.items():
        upper = variable.upper()
        if not upper.startswith(PREFIX):
            continue
        name = upper[len(PREFIX) :].lower()
        parse = _FIELDS.get(name)
        if parse is None:
            continue  # pydantic-settings ignores variables that name no field
        try:
            found[name] = parse(text)
        except ValueError:
            raise ModelLoadError(f"{variable}={text!r} is not a valid {name} setting") from None
    return found


def seldon_parameters(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Seldon Core v1's ``PREDICTIVE_UNIT_PARAMETERS``, typed by each entry's ``type``."""
    text = environ.get(SELDON_PARAMETERS, "")
    if not text.strip():
        return {}
    try:
        entries = json.loads(text)
        if not isinstance(entries, list):
            raise ValueError(text)
        found: dict[str, Any] = {}
        for entry in entries:
            parse = _SELDON_TYPES.get(str(entry.get("type")))
            if parse is None:
                raise ModelLoadError(
                    f"{SELDON_PARAMETERS}: parameter {entry.get('name')!r} has type "
                    f"{entry.get('type')!r} (known: {', '.join(_SELDON_TYPES)})"
                )
            if str(entry["name"]) in _FIELDS:  # MLServer ignores parameters it has no field for
                found[str(entry["name"])] = parse(str(entry["value"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ModelLoadError(
            f"{SELDON_PARAMETERS} is not a JSON list of {{name, value, type}} entries whose "
            "values read as their types"
        ) from None
    return found


def merged_extra(
    extra: Mapping[str, Any], environ: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """``parameters.extra`` with the environment's settings: a variable fills a setting the
    file leaves out, Seldon's parameters override the file (MLServer's precedence)."""
    return {**settings_from_environment(environ), **extra, **seldon_parameters(environ)}
