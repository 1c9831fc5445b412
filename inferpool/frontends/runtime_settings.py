"""Triton's ``trace`` and ``logging`` extensions: the settings documents both frontends
read and update (REST ``/v2/trace/setting``, ``/v2/models/{m}/trace/setting`` and
``/v2/logging``; gRPC TraceSetting and LogSettings).

Trace settings are ``observability.trace_control``'s. Log settings map onto Python's
levels of the root logger, in every process that logs (``EngineClient.set_log_levels``:
the server, then the template and each worker by a control message):

- ``log_verbose_level`` > 0: DEBUG; else ``log_info``: INFO; else ``log_warning``: WARNING;
  else ``log_error``: ERROR; else CRITICAL only. Read back from the root's level.
- ``log_format``: ``text`` (Triton's ``default`` is taken as it) or ``json``, the format of
  the lines the server writes. Triton's ``ISO8601`` is refused (``json`` has ISO 8601 times).
- ``log_file``: ``""`` only: the server writes to stderr.

Per-logger levels (``--log-levels``) stay as they are. An update is an admin action: it
needs the admin token when one is set (``AdminPolicy.require_token``); a bad value is a
``BadRequest`` (400, INVALID_ARGUMENT) and changes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from inferpool import logs
from inferpool.errors import BadRequest
from inferpool.frontends.dataplane import DataPlane
from inferpool.observability.trace_control import CONTROL

LOG_FLAGS = ("log_info", "log_warning", "log_error")
FORMATS = {"text": "text", "json": "json", "default": "text"}


def trace_settings(
    plane: DataPlane,
    changes: dict[str, Any] | None,
    model: str | None,
    authorization: str | None,
) -> dict[str, Any]:
    """The trace settings (of ``model``, or the server's) after ``changes`` (None: a read)."""
    if model is not None:
        plane.model_ready(model, None)  # an unknown model is a 404
    if changes is None:
        return CONTROL.document(model)
    plane.client.admin.require_token(authorization)
    return CONTROL.update(changes, model)


def log_document() -> dict[str, Any]:
    level = logging.getLogger().getEffectiveLevel()
    return {
        "log_file": "",
        "log_info": level <= logging.INFO,
        "log_warning": level <= logging.WARNING,
        "log_error": level <= logging.ERROR,
        "log_verbose_level": 1 if level <= logging.DEBUG else 0,
        "log_format": logs.log_format(),
    }


def log_settings(
    plane: DataPlane, changes: dict[str, Any] | None, authorization: str | None
) -> dict[str, Any]:
    """The log settings after ``changes`` (None: a read), applied in every process."""
    if changes is None:
        return log_document()
    plane.client.admin.require_token(authorization)
    settings = log_document()
    for key, value in changes.items():
        settings[key] = _checked(key, value)
    level = _level(settings)
    if level != logging.getLogger().level:
        plane.client.set_log_levels({"": level})
    if settings["log_format"] != logs.log_format():
        logs.set_format(settings["log_format"])
    return log_document()


def _level(settings: dict[str, Any]) -> int:
    if settings["log_verbose_level"] > 0:
        return logging.DEBUG
    for flag, level in zip(LOG_FLAGS, (logging.INFO, logging.WARNING, logging.ERROR), strict=True):
        if settings[flag]:
            return level
    return logging.CRITICAL


def _checked(key: str, value: Any) -> Any:
    """One log setting's value, checked."""
    if key in LOG_FLAGS:
        if not isinstance(value, bool):
            raise BadRequest(f"{key} must be true or false, not {value!r}")
        return value
    if key == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadRequest(f"log_verbose_level must be an integer >= 0, not {value!r}")
        return value
    if key == "log_format":
        if value not in FORMATS:
            raise BadRequest(
                f"log_format must be 'text' (Triton's 'default') or 'json' (times in "
                f"ISO 8601), not {value!r}"
            )
        return FORMATS[value]
    if key == "log_file":
        if value != "":
            raise BadRequest("log_file cannot be set: the server writes its log to stderr")
        return value
    known = ", ".join(log_document())
    raise BadRequest(f"unknown log setting '{key}' (the settings are {known})")
