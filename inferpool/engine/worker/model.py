"""A loaded model: its runtime plus what the inference path needs precomputed at load time
(its metadata, its batching policy, its custom endpoints)."""

from __future__ import annotations

import logging
from typing import Any

from inferpool.codecs.image import declared_images
from inferpool.codecs.image_spec import ImageSpec
from inferpool.codecs.payload import check_model_content_type
from inferpool.engine.worker.batching import DEFAULT_RANK, BatchPolicy, policy
from inferpool.errors import ModelLoadError
from inferpool.protocol.endpoints import Announced, announce
from inferpool.runtimes.base import Runtime
from inferpool.runtimes.endpoints import Endpoint, endpoint_table
from inferpool.runtimes.registry import runtime_class
from inferpool.settings import ModelSettings

logger = logging.getLogger(__name__)


class LoadedModel:
    """A runtime that has loaded its artefact, with its metadata computed once."""

    __slots__ = (
        "batching", "default_rank", "endpoints", "image_inputs", "image_outputs",
        "input_content_types", "metadata", "output_names", "runtime", "settings",
    )  # fmt: skip

    def __init__(self, settings: ModelSettings, runtime: Runtime) -> None:
        self.settings = settings
        self.runtime = runtime
        self.metadata: dict[str, Any] = runtime.metadata()
        self.input_content_types: dict[str, str] = {
            spec.name: spec.parameters["content_type"]
            for spec in runtime.inputs()
            if spec.parameters.get("content_type")
        }
        self.output_names = [spec.name for spec in runtime.outputs()]
        # Inputs and outputs declared as PNG/JPEG images (empty for almost every model, so
        # the path pays one truth test for them).
        self.image_inputs: dict[str, ImageSpec] = declared_images(runtime.inputs(), "input")
        self.image_outputs: dict[str, ImageSpec] = declared_images(runtime.outputs(), "output")
        self.batching: BatchPolicy = policy(settings, runtime)
        # Where its requests that ask for no priority queue (``batching.Batcher``).
        self.default_rank = settings.parameters.default_priority_level or DEFAULT_RANK
        self.endpoints: dict[str, Endpoint] = endpoint_table(runtime)

    def announced(self) -> dict[str, Any]:
        """The metadata a load answers with: the model's, and its endpoints for routing."""
        paths = {path: list(endpoint.methods) for path, endpoint in self.endpoints.items()}
        mlserver = self.runtime.platform == "mlserver"  # an MLModel (mlserver/adapter/runtime.py)
        # Its predict_stream takes a client's whole stream (MLServer's), not one request.
        whole = bool(getattr(self.runtime, "stream_input", False))
        announced = Announced(paths, self.runtime.bare_endpoints, mlserver, whole)
        return announce(self.metadata, announced)

    @property
    def name(self) -> str:
        return self.settings.name


def load_model(settings: ModelSettings) -> LoadedModel:
    """Import the model's runtime and load it; raises with a one-line reason on failure."""
    check_model_content_type(settings.parameters.content_type)
    runtime = runtime_class(settings)(settings)
    runtime.load()
    runtime = runtime.serving()
    return LoadedModel(settings, runtime)


def unload_model(model: LoadedModel) -> None:
    """Let the runtime release what it holds (``Runtime.unload``: an MLServer model's
    ``unload()``) and close its custom metrics. Never raises: a failing ``unload`` is
    logged with its traceback, and the model is unloaded all the same (as MLServer, whose
    server stays up)."""
    model.runtime.metrics.close()  # its custom counters keep their last values
    try:
        model.runtime.unload()
    except Exception:
        logger.exception("model '%s': unload() raised; the model is unloaded anyway", model.name)


def failure_reason(exc: BaseException) -> str:
    """One line for a model that failed to load: the first line of its message, after the
    exception's type unless it is a ``ModelLoadError`` (whose message says it all)."""
    text = str(exc).strip()
    name = type(exc).__name__
    if not text:
        return name
    message = text.splitlines()[0]
    return message if isinstance(exc, ModelLoadError) else f"{name}: {message}"
