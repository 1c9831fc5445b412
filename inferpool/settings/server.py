"""``ServerSettings``: everything that configures one server process, with every default
in one place (its fields, by concern, are in ``inferpool.settings.server_fields``).

Precedence, lowest first: defaults < MLServer's ``MLSERVER_*`` environment variables <
``settings.json`` (in the model repository, as MLServer reads it: its keys win over its
variables) < ``INFERPOOL_*`` environment variables < command-line flags. The MLServer
sources are ``inferpool.settings.sources``; ``load_server_settings``
(``inferpool.settings.loading``) builds one for a repository.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from inferpool.mlserver.contract.server_settings import (
    cors_with_environment,
    warn_idle_cors_variables,
)
from inferpool.settings.server_fields import TimeoutFields, WorkerGroupSettings
from inferpool.settings.sources import mlserver_sources
from inferpool.settings.validators import histogram_bounds, parse_level, parse_levels, parse_tags


class ServerSettings(TimeoutFields):
    """Everything that configures one server process; ``inferpool serve --help`` lists it."""

    model_config = SettingsConfigDict(env_prefix="INFERPOOL_", extra="ignore")

    # -- the model repository API
    model_control_mode: Literal["none", "explicit", "poll"] = Field(
        "explicit",
        description="none: the models of the repository at start-up, no load/unload API; "
        "explicit: the repository API loads and unloads models; "
        "poll: the repository is watched: a model folder added, changed or removed is "
        "loaded, reloaded or unloaded (the load/unload API works too)",
    )
    repository_debounce: float = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="poll mode: seconds a changed model folder must stay quiet "
        "before it is acted on",
    )
    # -- models whose parameters.uri is s3://, gs:// or http(s):// (docs/operate/remote-storage.md)
    storage_cache_dir: Path | None = Field(
        None,
        description="where remote model artefacts (a parameters.uri of s3://, gs://, "
        "http(s)://) are kept, by URI and object version; default: "
        "$XDG_CACHE_HOME/inferpool/storage",
    )
    storage_max_size: int = Field(
        4096,
        ge=1,
        description="MiB a remote model artefact may hold: a larger one fails its model "
        "before it is downloaded (or as soon as the bytes received pass it)",
    )
    storage_timeout: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds a store may take to accept a connection or to send the next "
        "bytes before fetching a remote model artefact fails",
    )
    storage_poll_interval: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="poll mode: seconds between checks of each remote model artefact's "
        "version (one request each); a new version (ETag, generation) reloads the model",
    )
    admin_token: str | None = Field(
        None,
        description="token that load/unload and other admin calls must carry "
        "(Authorization: Bearer TOKEN); unset: no token asked",
    )
    admin_token_file: Path | None = Field(
        None, description="file holding the admin token (read at start-up)"
    )
    # -- transport security and inference keys (docs/operate/security.md)
    tls_certificate: Path | None = Field(
        None,
        description="PEM certificate chain served over TLS on the REST and gRPC ports (the "
        "metrics port stays plain); needs --tls-key; re-read when the file changes",
    )
    tls_key: Path | None = Field(
        None, description="PEM private key of --tls-certificate; re-read when it changes"
    )
    tls_client_ca: Path | None = Field(
        None,
        description="PEM CA bundle: with it, clients must present a certificate it signed "
        "(mutual TLS) on the REST and gRPC ports",
    )
    api_keys_file: Path | None = Field(
        None,
        description="file of API keys that inference calls must carry (Authorization: Bearer "
        "KEY or X-API-Key: KEY; gRPC metadata alike): one key per line, optionally followed "
        "by the model names it is limited to; # starts a comment; re-read when it changes. "
        "Health probes stay open",
    )

    @field_validator("worker_tags", mode="before")
    @classmethod
    def _parse_tags(cls, value: Any) -> Any:
        return parse_tags(value)

    @field_validator("worker_groups")
    @classmethod
    def _distinct_group_names(cls, groups: list[WorkerGroupSettings]) -> list[WorkerGroupSettings]:
        names = [group.name for group in groups]
        if len(set(names)) != len(names) or "default" in names:
            raise ValueError(f"worker group names must differ and not be 'default': {names}")
        return groups

    @field_validator("log_levels", mode="before")
    @classmethod
    def _parse_log_levels(cls, value: Any) -> dict[str, str]:
        return parse_levels(value)

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        parse_level(value)
        return value

    @field_validator("metrics_latency_buckets", "metrics_batch_buckets", mode="before")
    @classmethod
    def _parse_buckets(cls, value: Any) -> Any:
        return histogram_bounds(value)

    @field_validator("cors_settings", mode="before")
    @classmethod
    def _cors_keys_from_environment(cls, value: Any) -> Any:
        return cors_with_environment(value, os.environ) if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _mlserver_rules(self) -> ServerSettings:
        # Nothing is loaded at start-up: ready with no model (as MLServer), unless told.
        if not self.load_models_at_startup and "allow_empty" not in self.model_fields_set:
            self.allow_empty = True
        if self.cors_settings is None:
            warn_idle_cors_variables(os.environ)
        if self.environment_tarball is not None:
            self._use_server_environment(self.environment_tarball)
        return self

    def _use_server_environment(self, tarball: Path) -> None:
        """Every model runs in ``environment_tarball``: in workers of its own interpreter,
        as many as the server's own unless ``environment_workers`` says otherwise."""
        if self.workers <= 0:
            raise ValueError(
                f"environment_tarball {tarball}: the models run in workers "
                "started with that environment's interpreter, and with --workers 0 there "
                "is none; give --workers 1 or more"
            )
        # Absolute now: a relative path means the directory the server was started in.
        self.environment_tarball = Path(os.path.abspath(tarball))
        if "environment_workers" not in self.model_fields_set:
            self.environment_workers = self.workers

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest first: the arguments (flags), INFERPOOL_* variables, then MLServer's.
        return (init_settings, env_settings, *mlserver_sources(settings_cls))
