"""MLServer's model settings (``mlserver.settings``) as a custom runtime reads them.

``self.settings`` of an ``inferpool.mlserver.MLModel`` is this ``ModelSettings``, built by the
adapter from the model's ``model-settings.json`` (``inferpool.mlserver.adapter.runtime``), with the
fields and defaults of MLServer 1.7.1. The server-wide ``Settings`` are inferpool's own
(``inferpool.settings``); a custom runtime has no use for them.
"""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from inferpool.mlserver.types import MetadataTensor


class ModelParameters(BaseModel):
    """The ``parameters`` block: per-instance values, and ``extra`` for the runtime."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    uri: str | None = None
    version: str | None = None
    environment_path: str | None = None
    environment_tarball: str | None = None
    inference_pool_gid: str | None = None
    autogenerate_inference_pool_gid: bool = False
    format: str | None = None
    content_type: str | None = None
    extra: dict[str, Any] | None = Field(default_factory=dict)


class ModelSettings(BaseModel):
    """One model's settings; ``implementation`` imports the runtime class it names."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=(), populate_by_name=True)

    # The settings file this came from: relative URIs are relative to its folder.
    _source: str | None = PrivateAttr(default=None)

    name: str = ""
    platform: str = ""
    versions: list[str] = Field(default_factory=list)
    inputs: list[MetadataTensor] = Field(default_factory=list)
    outputs: list[MetadataTensor] = Field(default_factory=list)
    parallel_workers: int | None = None
    warm_workers: bool = False
    max_batch_size: int = 0
    max_batch_time: float = 0.0
    implementation_: str = Field(
        validation_alias=AliasChoices("implementation", "implementation_"),
        serialization_alias="implementation",
    )
    parameters: ModelParameters | None = None
    cache_enabled: bool = False

    @field_validator("implementation_", mode="before")
    @classmethod
    def _import_path(cls, value: Any) -> Any:
        # ``ModelSettings(implementation=MyModel)`` names the class by its import path.
        if isinstance(value, type):
            return f"{value.__module__}.{value.__name__}"
        return value

    @property
    def implementation(self) -> type:
        module_name, _, class_name = self.implementation_.rpartition(".")
        implementation: type = getattr(importlib.import_module(module_name), class_name)
        return implementation

    @property
    def version(self) -> str | None:
        return self.parameters.version if self.parameters is not None else None
