"""MLServer's data-plane types (``mlserver.types``), for custom runtimes written against it.

Same names, fields and behaviour as MLServer 1.7.1's pydantic models, so that a runtime
that builds or reads them runs after changing only its import line. These live on the
custom-runtime path only: inferpool's own request path uses ``inferpool.protocol.types``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import pydantic
from pydantic import ConfigDict, Field, RootModel


class BaseModel(pydantic.BaseModel):
    """Dumps leave out unset and None fields by default, as the V2 JSON documents do."""

    model_config = ConfigDict(protected_namespaces=(), use_enum_values=True)

    def model_dump(
        self, exclude_unset: bool = True, exclude_none: bool = True, **kwargs: Any
    ) -> dict[str, Any]:
        return super().model_dump(exclude_unset=exclude_unset, exclude_none=exclude_none, **kwargs)

    def model_dump_json(
        self, exclude_unset: bool = True, exclude_none: bool = True, **kwargs: Any
    ) -> str:
        return super().model_dump_json(
            exclude_unset=exclude_unset, exclude_none=exclude_none, **kwargs
        )


class Datatype(Enum):
    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"


class Parameters(BaseModel):
    """Free-form parameters; codecs also keep their decoded payload here."""

    model_config = ConfigDict(extra="allow")

    content_type: str | None = None
    headers: dict[str, Any] | None = None


class TensorData(RootModel[list[Any] | Any]):
    """A tensor's elements as sent (flat or nested lists); iterable and indexable."""

    root: list[Any] | Any = Field(..., title="TensorData")

    def __iter__(self) -> Any:
        return iter(self.root)

    def __getitem__(self, index: Any) -> Any:
        return self.root[index]

    def __len__(self) -> int:
        return len(self.root)


class MetadataServerResponse(BaseModel):
    name: str
    version: str
    extensions: list[str]


class MetadataServerErrorResponse(BaseModel):
    error: str


class MetadataModelErrorResponse(BaseModel):
    error: str


class InferenceErrorResponse(BaseModel):
    error: str | None = None


class MetadataTensor(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int]
    parameters: Parameters | None = None


class RequestInput(BaseModel):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: Parameters | None = None
    data: TensorData


class RequestOutput(BaseModel):
    name: str
    parameters: Parameters | None = None


class ResponseOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: Parameters | None = None
    data: TensorData


class InferenceRequest(BaseModel):
    id: str | None = None
    parameters: Parameters | None = None
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class InferenceResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[ResponseOutput]


class MetadataModelResponse(BaseModel):
    name: str
    versions: list[str] | None = None
    platform: str
    inputs: list[MetadataTensor] | None = None
    outputs: list[MetadataTensor] | None = None
    parameters: Parameters | None = None


__all__ = [
    "Datatype",
    "InferenceErrorResponse",
    "InferenceRequest",
    "InferenceResponse",
    "MetadataModelErrorResponse",
    "MetadataModelResponse",
    "MetadataServerErrorResponse",
    "MetadataServerResponse",
    "MetadataTensor",
    "Parameters",
    "RequestInput",
    "RequestOutput",
    "ResponseOutput",
    "TensorData",
]
