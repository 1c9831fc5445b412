"""A custom runtime for the content-type tests, copied into each test model's folder.

``mode: describe`` answers with a JSON description of the Python types it received;
``mode: mirror`` returns its payload unchanged (so the response encodes what it got).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import inferpool


def describe_value(value: Any) -> dict[str, Any]:
    described: dict[str, Any] = {"type": type(value).__name__}
    if isinstance(value, np.ndarray):
        described["dtype"] = str(value.dtype)
        described["shape"] = list(value.shape)
        flat = value.reshape(-1)
        if flat.size:
            described["element"] = type(flat[0]).__name__
    elif isinstance(value, list):
        described["length"] = len(value)
        if value:
            described["element"] = type(value[0]).__name__
        described["value"] = repr(value)
    return described


def describe(payload: Any) -> dict[str, Any]:
    if isinstance(payload, Mapping):
        return {"payload": "dict", "items": {k: describe_value(v) for k, v in payload.items()}}
    if isinstance(payload, inferpool.InferenceRequest):
        tensors = {t.name: describe_value(t.data) for t in payload.inputs}
        return {"payload": "InferenceRequest", "items": tensors}
    if type(payload).__name__ == "DataFrame":
        columns = {str(c): str(payload[c].dtype) for c in payload.columns}
        return {"payload": "DataFrame", "columns": columns, "rows": len(payload)}
    return {"payload": type(payload).__name__, "value": describe_value(payload)}


class EchoRuntime(inferpool.Runtime):
    def load(self) -> None:
        self.accepts = self.settings.parameters.extra.get("accepts", "dict")
        self.mode = self.settings.parameters.extra.get("mode", "describe")

    def default_outputs(self) -> list[str]:
        return [spec.name for spec in self.outputs()]

    def predict(self, payload: Any, outputs: Sequence[str]) -> Any:
        if self.mode == "describe":
            return {"echo": describe(payload)}
        if self.settings.outputs:
            return {name: payload[name] for name in outputs if name in payload}
        return payload
