"""Parsers of settings values given as text (a flag, an ``INFERPOOL_*`` variable) or as
JSON (``settings.json``): log levels, histogram bucket bounds, tag lists.

Plain functions raising ``ValueError``, which pydantic words as a validation error; they
import nothing of inferpool, so that ``logs`` (which applies the levels) and the settings
models share them without importing each other.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Mapping
from typing import Any

import orjson

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL}  # fmt: skip


def parse_level(value: object) -> str:
    """A level name as the settings keep it (lower case); ValueError for any other."""
    name = str(value).strip().lower()
    if name not in LEVELS:
        raise ValueError(f"unknown log level {value!r}: use one of {', '.join(LEVELS)}")
    return name


def parse_levels(value: object) -> dict[str, str]:
    """``log_levels`` from ``"inferpool.access=info,uvicorn.error=warning"`` (the flag or
    the environment), a JSON object in a string, or a mapping (``settings.json``)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                value = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"log_levels: not valid JSON ({exc})") from None
        else:
            pairs = [item.partition("=") for item in text.split(",") if item.strip()]
            bad = [f"{name}{sep}{level}" for name, sep, level in pairs if not sep]
            if bad:
                raise ValueError(f"log_levels: {bad[0]!r} is not LOGGER=LEVEL")
            value = {name.strip(): level for name, _, level in pairs}
    if not isinstance(value, Mapping):
        raise ValueError("log_levels: give LOGGER=LEVEL pairs or a JSON object")
    levels = {}
    for name, level in value.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError("log_levels: a logger name is empty")
        levels[name.strip()] = parse_level(level)
    return levels


def histogram_bounds(value: Any) -> list[float]:
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


def parse_tags(value: Any) -> Any:
    """Tags as a comma list or a JSON list (text); anything else is left to pydantic."""
    if isinstance(value, str):
        text = value.strip()
        return json.loads(text) if text.startswith("[") else [t for t in text.split(",") if t]
    return value
