"""The explainer runtime: a model that answers ``/infer`` with another model's
explanation, so that any V2 client (gRPC ``ModelInfer`` included) can ask for one.

Its ``model-settings.json`` names the runtime and the explained model's folder, relative
to its own (``parameters.explains``, or ``parameters.extra.explains``)::

    {"name": "churn-explainer", "implementation": "explainer",
     "parameters": {"explains": "../churn"}}

It loads that model itself (its own copy, with the folder's settings), takes the same
inputs and answers one output, ``contributions``, as ``POST /v2/models/churn/explain``
would (``runtimes/explain.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inferpool.errors import ModelLoadError
from inferpool.protocol.types import TensorSpec
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.explain import OUTPUT

SETTING = "explains"


class ExplainerRuntime(Runtime):
    platform = "explainer"
    accepts = "request"  # the explained model decodes the request its own way

    def load(self) -> None:
        from inferpool.engine.worker.model import load_model
        from inferpool.runtimes.registry import runtime_name_for
        from inferpool.settings import read_model_settings

        folder = self._explained_folder()
        try:
            settings = read_model_settings(folder, folder.name)
        except ValueError as exc:
            raise ModelLoadError(f"the explained model: {exc}") from None
        if runtime_name_for(settings) == self.platform:
            raise ModelLoadError(f"{folder} is an explainer too: name the model it explains")
        self.explained = load_model(settings)

    def _explained_folder(self) -> Path:
        parameters = self.settings.parameters
        value = (parameters.model_extra or {}).get(SETTING, parameters.extra.get(SETTING))
        if not isinstance(value, str) or not value:
            raise ModelLoadError(
                f"an explainer names the model it explains: parameters.{SETTING}, its "
                "folder (relative to this model's)"
            )
        folder = self.settings.resolve(value)
        if not folder.is_dir():
            raise ModelLoadError(f"parameters.{SETTING}: {folder} is not a folder")
        return folder

    def inputs(self) -> list[TensorSpec]:
        return super().inputs() or self.explained.runtime.inputs()

    def outputs(self) -> list[TensorSpec]:
        return self.settings.output_specs() or [TensorSpec(OUTPUT, "FP64", [-1, -1])]

    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any]:
        from inferpool.engine.worker.explain import attributions

        return {OUTPUT: attributions(self.explained, payload)}

    def limit_threads(self, threads: int) -> None:
        self.explained.runtime.limit_threads(threads)

    def native_bytes(self) -> int:
        return self.explained.runtime.native_bytes()
