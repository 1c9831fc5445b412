"""A refused setting as one sentence that names where the value came from.

pydantic's ValidationError names a field and says what is wrong with the value in its own
words (with a URL); a user set a flag, a variable or a key of settings.json. Each error
becomes one line: the source (``--http-port``, ``INFERPOOL_HTTP_PORT``, ``settings.json
key 'http_port'``, ``MLSERVER_HTTP_PORT``), what is allowed (from the field's type and
constraints, so inferpool.settings stays the one place that says it) and the value given.
"""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from inferpool.cli_flags import flag, mlserver_names
from inferpool.mlserver.contract.server_settings import SERVER_PREFIX
from inferpool.settings import SETTINGS_FILE, ServerSettings

_ENV_PREFIX = "INFERPOOL_"


def source_of(
    name: str,
    overrides: Mapping[str, Any],
    repository: Path | None,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """Where the value of setting ``name`` came from, the highest source first (the
    precedence of inferpool.settings.server): the flag, the variable, settings.json, MLServer's
    variable."""
    if name in overrides:
        return "the repository argument" if name == "model_repository" else flag(name)
    variable = _ENV_PREFIX + name.upper()
    if any(key.upper() == variable for key in environ):
        return variable
    mlserver = mlserver_names().get(name)
    keys = [name] + ([mlserver] if mlserver else [])
    if repository is not None:
        path = repository / SETTINGS_FILE
        for key in keys:
            if key in _file_keys(path):
                return f"{path} key '{key}'"
    if mlserver and SERVER_PREFIX + mlserver.upper() in environ:
        return SERVER_PREFIX + mlserver.upper()
    return f"the setting {name}"


def _file_keys(path: Path) -> set[str]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    return set(document) if isinstance(document, dict) else set()


def allowed(field: FieldInfo) -> str:
    """What a value of ``field`` may be, in words: its kind and its bounds."""
    annotation = field.annotation
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(str(choice) for choice in typing.get_args(annotation))
    kind = {int: "a whole number", float: "a number", bool: "true or false"}.get(
        annotation,  # type: ignore[arg-type]
        "",
    )
    low = high = None
    for constraint in field.metadata:
        if isinstance(constraint, annotated_types.Ge):
            low = constraint.ge
        elif isinstance(constraint, annotated_types.Le):
            high = constraint.le
    if low is not None and high is not None:
        return f"{kind} from {low} to {high}"
    if low is not None:
        return f"{kind} of at least {low}"
    if high is not None:
        return f"{kind} of at most {high}"
    return kind


# Errors of a value's type or bounds: the sentence says what is allowed instead of how
# pydantic words it.
_RANGE_ERRORS = frozenset(
    {
        "greater_than_equal",
        "less_than_equal",
        "int_parsing",
        "int_from_float",
        "int_type",
        "float_parsing",
        "float_type",
        "finite_number",
        "bool_parsing",
        "bool_type",
        "literal_error",
    }
)


def sentence(error: ErrorDetails, overrides: Mapping[str, Any], repository: Path | None) -> str:
    """One error of a ServerSettings validation, as one sentence."""
    location = error["loc"]
    name = str(location[0]) if location else ""
    field = ServerSettings.model_fields.get(name)
    if field is None:
        return error["msg"].removeprefix("Value error, ") + "."
    source = source_of(name, overrides, repository)
    given = _shown(error.get("input"))
    if error["type"] in _RANGE_ERRORS and len(location) == 1:
        note = f" ({field.description})" if field.description else ""
        return f"{source}{note} must be {allowed(field)}, not {given}."
    inner = ".".join(str(part) for part in location[1:])
    where = f"{source} {inner}" if inner else source
    message = error["msg"].removeprefix("Value error, ").rstrip(".")
    return f"{where}: {message}."


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value if value.strip() else repr(value)
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def sentences(
    exc: ValidationError, overrides: Mapping[str, Any], repository: Path | None
) -> list[str]:
    """Each error of ``exc`` as one sentence naming its source."""
    return [sentence(error, overrides, repository) for error in exc.errors()]
