"""Typed V2 request and response structs used inside the engine, whatever the wire format.

Plain slotted dataclasses: cheap to build on the hot path, no validation machinery.
Tensor data is always a numpy array shaped as declared (BYTES as an object array of bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class Tensor:
    """A named tensor: an input of a request or an output of a response."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def content_type(self) -> str | None:
        return self.parameters.get("content_type")


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferenceRequest:
    inputs: list[Tensor]
    id: str | None = None
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    # Its BYTES data came as JSON strings (REST): MLServer hands those to a model as str.
    json_strings: bool = field(default=False, compare=False)

    @property
    def content_type(self) -> str | None:
        return self.parameters.get("content_type")


@dataclass(slots=True)
class InferenceResponse:
    model_name: str
    outputs: list[Tensor]
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class TensorSpec:
    """A tensor as model metadata describes it; -1 marks a variable dimension."""

    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "datatype": self.datatype, "shape": self.shape}
        if self.parameters:
            out["parameters"] = self.parameters
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TensorSpec:
        return cls(
            name=raw["name"],
            datatype=raw["datatype"],
            shape=list(raw.get("shape", [-1])),
            parameters=dict(raw.get("parameters") or {}),
        )
