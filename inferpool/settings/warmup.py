"""Warm-up samples of a model's ``model-settings.json`` (``warmup``): the requests each
replica runs before it is READY (``engine/worker/warmup.py`` runs them, docs/warmup.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from inferpool.protocol.datatypes import DATATYPES, element_count


class WarmupInput(BaseModel):
    """One input of a warm-up sample: ``data`` is ``"zero"``, ``"random"`` (seeded: the same
    values on every load) or the values themselves, as a V2 JSON request carries them."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    datatype: str
    # Generated data: a -1 first dimension is the sample's batch_size, any other -1 is 1.
    shape: list[StrictInt]
    data: Literal["zero", "random"] | list[Any]
    parameters: dict[str, Any] = Field(default_factory=dict)

    @field_validator("datatype")
    @classmethod
    def _known_datatype(cls, value: str) -> str:
        if value not in DATATYPES:
            raise ValueError(f"unknown datatype {value!r}; expected one of {', '.join(DATATYPES)}")
        return value

    @model_validator(mode="after")
    def _data_fits_shape(self) -> WarmupInput:
        if any(dim < -1 for dim in self.shape):
            raise ValueError(f"input '{self.name}': shape {self.shape} has a dimension below -1")
        if isinstance(self.data, list):
            if -1 in self.shape:
                raise ValueError(
                    f"input '{self.name}': explicit data needs a shape without -1, not {self.shape}"
                )
            declared, given = element_count(tuple(self.shape)), _leaf_count(self.data)
            if declared != given:
                raise ValueError(
                    f"input '{self.name}': shape {self.shape} holds {declared} values, "
                    f"data has {given}"
                )
        return self


class WarmupSample(BaseModel):
    """A warm-up request run ``count`` times on each replica before it is READY: generated
    ``inputs`` (the model's declared inputs with zeros when omitted) or a ``request_file``,
    a V2 JSON inference request in the model's folder (docs/warmup.md)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    count: StrictInt = Field(1, ge=1, le=1000)
    batch_size: StrictInt = Field(1, ge=1, le=65536)
    inputs: list[WarmupInput] | None = Field(None, min_length=1)
    request_file: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_source(self) -> WarmupSample:
        if self.request_file is None:
            return self
        if self.inputs is not None:
            raise ValueError(f"warm-up '{self.name}': give inputs or a request_file, not both")
        if self.batch_size != 1:
            raise ValueError(
                f"warm-up '{self.name}': batch_size applies to generated inputs; a request "
                "file holds its own shapes"
            )
        path = Path(self.request_file)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError(
                f"warm-up '{self.name}': request_file {self.request_file!r} must be a path "
                "inside the model's folder"
            )
        return self


def _leaf_count(data: list[Any]) -> int:
    """The values in nested lists (without recursion: nesting depth is the file's)."""
    count, pending = 0, [data]
    while pending:
        for item in pending.pop():
            if isinstance(item, list):
                pending.append(item)
            else:
                count += 1
    return count
