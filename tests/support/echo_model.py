"""The echo runtime of the tests: a model folder gets a copy of this file (see
``tests.support.runtimes.write_echo_model``), so it imports nothing from ``tests``.

``parameters.extra`` chooses its behaviour:

- ``mode``: ``echo`` (the default) answers each requested output with the input of the
  same name, if one came; ``mirror`` returns the payload unchanged (so the response
  encodes what it got); ``describe`` answers ``echo`` with a JSON description of the
  Python types it received.
- ``accepts``: the payload type asked of the codecs (``dict`` by default).

Its outputs are the declared outputs, else the declared inputs, else ``output-0``; all of
them are computed by default. In ``echo`` mode, inputs named ``mark``, ``sleep`` and
``fail`` are test hooks: the model writes its pid into the file ``mark`` names, sleeps,
or raises.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
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


def run_hooks(payload: Mapping[str, Any]) -> None:
    if "mark" in payload:
        Path(payload["mark"].reshape(-1)[0].decode()).write_text(str(os.getpid()))
    if "sleep" in payload:
        time.sleep(float(payload["sleep"].reshape(-1)[0]))
    if "fail" in payload:
        raise ValueError("asked to fail")


class EchoRuntime(inferpool.Runtime):
    def load(self) -> None:
        extra = self.settings.parameters.extra
        self.accepts = extra.get("accepts", "dict")
        self.mode = extra.get("mode", "echo")

    def outputs(self) -> list[inferpool.TensorSpec]:
        return self.settings.output_specs() or self.inputs() or super().outputs()

    def default_outputs(self) -> list[str]:
        return [spec.name for spec in self.outputs()]

    def predict(self, payload: Any, outputs: Sequence[str]) -> Any:
        if self.mode == "describe":
            return {"echo": describe(payload)}
        if self.mode == "mirror":
            return payload
        run_hooks(payload)
        return {name: payload[name] for name in outputs if name in payload}
