"""One model's settings: ``ModelSettings`` (a ``model-settings.json``, MLServer's shape
plus inferpool's keys), its ``parameters`` block and its ``version_policy``.

Reading the file (with MLServer's key checks and the model variables) is
``inferpool.settings.loading``; warm-up samples are ``inferpool.settings.warmup``, the
``pipeline`` key ``inferpool.settings.pipeline``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from inferpool.protocol.types import TensorSpec
from inferpool.settings.pipeline import PipelineSpec
from inferpool.settings.warmup import WarmupSample

MODEL_SETTINGS_FILE = "model-settings.json"


class ModelParameters(BaseModel):
    """The ``parameters`` block of a model-settings file (MLServer's shape)."""

    model_config = ConfigDict(extra="allow")

    uri: str | None = None
    version: str | None = None
    content_type: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    # Requests per second the model takes (engine/rate_limits.py), and how many at once;
    # None: the server's --rate-limit (0 there: no limit).
    rate_limit: float | None = Field(None, gt=0, allow_inf_nan=False)
    rate_limit_burst: int | None = Field(None, ge=1)
    # The priority level of its requests that ask for none (protocol/priority.py); None:
    # below every level a request asks for.
    default_priority_level: int | None = Field(None, ge=1, le=0xFFFF)


class LatestVersions(BaseModel):
    """Serve the ``num_versions`` newest versions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_versions: StrictInt = Field(ge=1)


class AllVersions(BaseModel):
    """Serve every version the repository holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SpecificVersions(BaseModel):
    """Serve the versions listed (numbers or strings, compared as version strings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    versions: tuple[str, ...]

    @field_validator("versions", mode="before")
    @classmethod
    def _as_strings(cls, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list | tuple) or not value:
            raise ValueError(f"give a list of at least one version, not {value!r}")
        versions = []
        for version in value:
            # A JSON true is no version, though Python's bool is an int.
            if isinstance(version, int) and not isinstance(version, bool):
                versions.append(str(version))
            elif isinstance(version, str) and version:
                versions.append(version)
            else:
                raise ValueError(f"a version is a number or a non-empty string, not {version!r}")
        return tuple(versions)


class VersionPolicy(BaseModel):
    """Which of a model's versions are served: Triton's ``version_policy``, exactly one of
    ``{"latest": {"num_versions": N}}``, ``{"all": {}}``, ``{"specific": {"versions": [...]}}``.
    A model without one serves all its versions (MLServer's behaviour)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latest: LatestVersions | None = None
    all: AllVersions | None = None
    specific: SpecificVersions | None = None

    @model_validator(mode="after")
    def _one_choice(self) -> VersionPolicy:
        chosen = [name for name in ("latest", "all", "specific") if getattr(self, name) is not None]
        if len(chosen) != 1:
            given = " and ".join(chosen) if chosen else "none"
            raise ValueError(f"give exactly one of latest, all or specific (given: {given})")
        return self


class ModelSettings(BaseModel):
    """One model: read from its folder's ``model-settings.json``, or inferred from its files."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    name: str
    implementation: str | None = None
    runtime: str | None = None
    parameters: ModelParameters = Field(default_factory=ModelParameters)
    inputs: list[dict[str, Any]] = Field(default_factory=list)
    outputs: list[dict[str, Any]] = Field(default_factory=list)
    # Batching (engine/worker/batching.py, docs/batching.md). max_batch_size: most rows
    # per predict; 0 (unset): batch queued requests, up to 256 rows, when the runtime's
    # rows are independent; 1 (or negative, which MLServer accepts): never batch.
    # max_batch_time: seconds a request may wait for others (MLServer's adaptive
    # batching); 0: take what is queued, never wait.
    max_batch_size: int = 0
    max_batch_time: float = Field(0.0, ge=0, allow_inf_nan=False)
    replicas: int | None = None
    # Seconds one predict may run (504, worker recycled); None: the server's model_timeout.
    timeout: float | None = None
    # MiB one call of the model may allocate in its worker (a MemoryError past it: 500);
    # None: only the worker's limit (engine/worker/memory_limit.py, docs/operate/memory.md).
    max_memory: int | None = Field(None, gt=0)
    # Which versions of the model are served (None: all); repository.discover applies it.
    version_policy: VersionPolicy | None = None
    # Requests run on each replica after it loads, before it is READY (worker/warmup.py).
    warmup: list[WarmupSample] = Field(default_factory=list)
    # What the workers holding it must offer: tags, or packages with versions
    # (``lightgbm>=4.0``); engine/environments/capabilities.py, docs/environments.md.
    requirements: list[str] = Field(default_factory=list)
    # A pipeline of other models instead of an artefact (engine/pipelines, docs/pipelines.md).
    pipeline: PipelineSpec | None = None
    folder: Path | None = None

    @field_validator("requirements")
    @classmethod
    def _valid_requirements(cls, requirements: list[str]) -> list[str]:
        # Lazily: the one parser that also matches them later, in a module that must not
        # import pydantic (it runs under environments' interpreters), so not from here;
        # loading the settings loads nothing of the engine (test_settings_layering.py).
        from inferpool.engine.environments.capabilities import check_requirements

        check_requirements(requirements)
        return requirements

    @field_validator("warmup")
    @classmethod
    def _distinct_warmup_names(cls, samples: list[WarmupSample]) -> list[WarmupSample]:
        # A failing sample is named in the model's reason: the name must say which.
        names = [sample.name for sample in samples]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"warm-up sample names must differ: {', '.join(repeated)} repeated")
        return samples

    @property
    def version(self) -> str | None:
        return self.parameters.version

    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec.from_dict(spec) for spec in self.inputs]

    def output_specs(self) -> list[TensorSpec]:
        return [TensorSpec.from_dict(spec) for spec in self.outputs]

    def resolve(self, relative: str) -> Path:
        """A path from the settings file, relative to the model's folder."""
        path = Path(relative)
        if not path.is_absolute() and self.folder is not None:
            path = self.folder / path
        return path
