"""The MLServer sources of ``ServerSettings`` (pydantic-settings sources): a repository's
``settings.json`` and the ``MLSERVER_*`` variables, their keys mapped to inferpool's (or
refused) by ``inferpool.mlserver.contract.server_settings``.

Which ``settings.json`` is read is set for the time one ``ServerSettings`` is built
(``reading_settings_file``), as pydantic-settings builds its sources per instance.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings, JsonConfigSettingsSource, PydanticBaseSettingsSource

from inferpool.mlserver.contract.server_settings import environment_values, server_values

_settings_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "inferpool_settings_file", default=None
)


@contextmanager
def reading_settings_file(path: Path | None) -> Iterator[None]:
    """``ServerSettings`` built inside read ``path`` (a ``settings.json``; None: none)."""
    token = _settings_file.set(path)
    try:
        yield
    finally:
        _settings_file.reset(token)


def mlserver_sources(settings_cls: type[BaseSettings]) -> list[PydanticBaseSettingsSource]:
    """MLServer's sources, highest first. As in MLServer, a key of settings.json wins over
    its MLSERVER_* variable (MLServer passes the file's keys to its Settings, over its
    environment)."""
    sources: list[PydanticBaseSettingsSource] = []
    path = _settings_file.get()
    if path is not None:
        sources.append(_MLServerJsonSource(settings_cls, json_file=path))
    sources.append(_MLServerEnvSource(settings_cls))
    return sources


class _MLServerEnvSource(PydanticBaseSettingsSource):
    """MLServer's ``MLSERVER_*`` variables, mapped to our settings (or refused)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads every variable at once

    def __call__(self) -> dict[str, Any]:
        return environment_values(os.environ, self.settings_cls.model_fields)


class _MLServerJsonSource(JsonConfigSettingsSource):
    """``settings.json``, with MLServer's key names mapped to ours (or refused)."""

    def __init__(self, settings_cls: type[BaseSettings], json_file: Path) -> None:
        super().__init__(settings_cls, json_file=json_file)
        self.path = json_file

    def __call__(self) -> dict[str, Any]:
        raw = super().__call__()
        return server_values(raw, self.settings_cls.model_fields, str(self.path))
