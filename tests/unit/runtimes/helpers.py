"""Load a model folder and run requests through the engine's inference path, in-process."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from inferpool.codecs.registry import decode_output
from inferpool.engine.worker import inference
from inferpool.engine.worker.model import LoadedModel, load_model
from inferpool.protocol.datatypes import datatype_of
from inferpool.protocol.types import InferenceRequest, RequestedOutput, Tensor
from inferpool.settings import read_model_settings


def load(folder: Path) -> LoadedModel:
    return load_model(read_model_settings(folder, folder.name))


def infer(model: LoadedModel, X: np.ndarray, outputs: list[str] | None = None) -> dict:
    """The outputs (name → array of the response's shape) for rows X as one input."""
    X = np.asarray(X)
    request = InferenceRequest(
        [Tensor("input-0", datatype_of(X), X.shape, X)],
        outputs=[RequestedOutput(name) for name in outputs or []],
    )
    response = inference.infer(model, request)
    # Decoded as a client would: by each output's content type (BYTES labels → str).
    return {t.name: np.asarray(decode_output(t)).reshape(t.shape) for t in response.outputs}
