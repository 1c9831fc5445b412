"""What the two MLServer contract modules (``server_settings``, ``model_settings``) share:
the settings logger with its once-per-process messages, and the reading of an
``MLSERVER_*`` variable's text as pydantic-settings reads it."""

from __future__ import annotations

import json
import logging
import typing
from types import UnionType
from typing import Any, Union

logger = logging.getLogger("inferpool.settings")

_logged: set[str] = set()


def warn_once(message: str, level: int = logging.WARNING) -> None:
    """Log a settings message once per process (discovery runs again and again)."""
    if message not in _logged:
        _logged.add(message)
        logger.log(level, "%s", message)


def parse_env(text: str, kind: Any) -> Any:
    """A variable's text; JSON when its type is structured, as pydantic-settings reads it."""
    if not _structured(kind) or text == "":
        return text  # pydantic parses numbers and booleans from text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a plain string where a string is allowed (logging_settings: a path)


def _structured(kind: Any) -> bool:
    kinds = typing.get_args(kind) if typing.get_origin(kind) in (Union, UnionType) else (kind,)
    return any(typing.get_origin(k) in (list, dict) or k in (list, dict) for k in kinds)
