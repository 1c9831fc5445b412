"""The Runtime interface that every model library implements (and users subclass).

A runtime loads one model and predicts. The engine decodes each request into the
payload the runtime ``accepts`` before calling ``predict``, and encodes what it returns,
so a runtime never sees wire formats.

A built-in runtime also has one entry in ``runtimes/registry.py`` (``RUNTIMES``): what the
engine must know of it before importing it (its library may be missing), such as the
modules the template preloads and whether its models may be loaded before forking.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from inferpool.protocol.types import InferenceRequest, InferenceResponse, TensorSpec
from inferpool.runtimes.metrics import ModelMetrics
from inferpool.settings import ModelSettings

if TYPE_CHECKING:
    from inferpool.runtimes.explain import Attributions

# What ``predict`` receives: the single input (or inputs side by side as columns) as an
# ndarray, a pandas DataFrame with one column per input, a dict of decoded inputs by
# name, or the InferenceRequest itself.
PAYLOAD_KINDS = ("array", "dataframe", "dict", "request")

# The variables native libraries read their thread pool's size from when they are loaded.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class Answer(dict[str, Any]):
    """What ``predict`` may return instead of a plain mapping to also set the response's
    own parameters (an MLServer custom runtime's ``InferenceResponse.parameters``)."""

    __slots__ = ("parameters",)

    def __init__(self, outputs: Mapping[str, Any], parameters: dict[str, Any]) -> None:
        super().__init__(outputs)
        self.parameters = parameters


class Runtime(ABC):
    """Serve one model. Subclass it, implement ``load`` and ``predict``."""

    #: the runtime's name in settings (``"runtime": "sklearn"``) and in metadata
    platform: ClassVar[str] = "custom"
    #: the form ``predict`` receives its inputs in; one of PAYLOAD_KINDS
    accepts: str = "array"
    #: what computes the predictions when that is worth a line in the load log (the
    #: tree kernel, or the library and why not the kernel); see ``predictor``
    predicted_by: str = ""
    #: exceptions that ``predict`` raises for input the model's library refuses (answered
    #: 400 with the library's message); anything else it raises is the model's fault (500)
    input_errors: ClassVar[tuple[type[Exception], ...]] = ()
    #: ``predict`` answers requested outputs by any name itself, from the request it
    #: accepts (an MLServer custom runtime); else a name not in ``outputs()`` is a 400
    open_outputs: ClassVar[bool] = False
    #: ``load`` starts no thread (no OpenMP or BLAS pool, no background thread) and leaves
    #: plain data (arrays, Python objects), so the template process may load the model
    #: before forking and the workers share its memory copy-on-write (set True in your
    #: subclass when that holds; the built-in runtimes say it in ``runtimes/registry.py``)
    fork_safe: ClassVar[bool] = False
    #: each row of a payload is predicted on its own (row i of the result depends on row i
    #: of the input only), so queued requests may be joined into one predict and split
    #: back without changing any answer: the engine then batches them by default
    #: (docs/batching.md). Set True in your subclass when that holds; the built-in
    #: runtimes say it here, an MLflow model when its flavour does.
    rows_independent: bool = False
    #: ``predict_requests`` joins the payloads of several queued requests (whole
    #: requests, ``accepts = "request"``) into one predict: an MLServer custom runtime
    #: with adaptive batching (``max_batch_size`` > 1 and ``max_batch_time`` > 0)
    joins_requests: bool = False
    #: also serve each custom endpoint at its bare path (``/path``, as MLServer's custom
    #: endpoints were) while this is the only loaded model using that path
    bare_endpoints: ClassVar[bool] = False

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        #: the model's own Prometheus metrics: ``self.metrics.counter(...)``, ``.gauge``,
        #: ``.histogram``, in ``load`` or ``predict`` (docs/operate/custom-metrics.md)
        self.metrics = ModelMetrics(settings.name, settings.version)

    @property
    def name(self) -> str:
        return self.settings.name

    @abstractmethod
    def load(self) -> None:
        """Load the model's artefact; raise with a one-line reason on failure."""

    @abstractmethod
    def predict(self, payload: Any, outputs: Sequence[str]) -> Mapping[str, Any] | Any:
        """Compute the requested outputs; return a mapping of output name to value.

        A single value (not a mapping) is taken as the first requested output.
        """

    def predict_requests(self, payloads: list[Any], outputs: Sequence[str]) -> list[dict[str, Any]]:
        """For a runtime that ``joins_requests``: one predict for the payloads of several
        requests (each asking for ``outputs``), and each one's result, in order."""
        raise NotImplementedError(f"the {self.platform} runtime does not join requests")

    def unload(self) -> None:  # noqa: B027 - optional hook
        """Release what ``load`` acquired when the model is unloaded (or replaced by a
        reload). What it raises is logged; the model is unloaded all the same."""

    def serving(self) -> Runtime:
        """The runtime that serves the model once ``load`` has run: this one, unless the
        artefact turned out to belong to a more specific runtime that took it over."""
        return self

    def inputs(self) -> list[TensorSpec]:
        """The model's inputs; settings win over anything the runtime derives."""
        return self.settings.input_specs()

    def outputs(self) -> list[TensorSpec]:
        """Every output the model can compute; the first is computed by default."""
        return self.settings.output_specs() or [TensorSpec("output-0", "BYTES", [-1])]

    def default_outputs(self) -> list[str]:
        return [self.outputs()[0].name]

    def validate(self, payload: Any) -> None:  # noqa: B027 - optional hook
        """Refuse a payload that cannot fit the model (raise BadRequest saying why)."""

    def limit_threads(self, threads: int) -> None:  # noqa: B027 - optional hook
        """Cap the native thread pools this model uses (workers × threads ≤ cores)."""

    def native_bytes(self) -> int:
        """Bytes the model holds outside Python objects that ``runtimes/footprint.py``
        cannot see (a native library's own buffers it does not know); 0 by default."""
        return 0

    def predictor(self) -> str:
        """What computes the predictions, for the load log; empty when nothing to say."""
        return self.predicted_by

    def custom_endpoints(self) -> dict[str, Callable[[bytes], Any]]:
        """Extra routes, ``POST /v2/models/{name}/{endpoint}``: raw body in, JSON-able out.
        (The ``inferpool.custom_endpoint`` decorator does more: GET, headers, status.)"""
        return {}

    def explain(self, payload: Any) -> Attributions:
        """Per-feature attributions of the model's score for ``payload`` (what ``predict``
        takes), answered by ``POST /v2/models/{name}/explain`` (``runtimes/explain.py``).
        Raise ``CannotExplain`` saying why not; by default a runtime cannot explain."""
        from inferpool.runtimes.explain import CannotExplain

        raise CannotExplain(f"the {self.platform} runtime has no explainer")

    def feedback(
        self,
        request: InferenceRequest,
        response: InferenceResponse,
        reward: float,
        truth: Any = None,
    ) -> Any:
        """Seldon Core's reward signal for an inference this model answered
        (``POST /v2/models/{name}/feedback``, gRPC ``inferpool.FeedbackService``).

        ``request`` and ``response`` arrive decoded as the typed V2 structs, the same over
        REST and gRPC; ``truth`` too when it is a V2 response, else as the JSON value sent
        (None when absent). Return None for ``200 {}``, or a body or ``EndpointResponse``
        as a custom endpoint does. The server counts every feedback and its reward
        (``inferpool_model_feedback_*`` metrics) whatever this does."""
        return None

    def metadata(self) -> dict[str, Any]:
        """V2 model metadata: never empty for a loaded model."""
        version = self.settings.version
        return {
            "name": self.name,
            "versions": [version] if version else [],
            "platform": self.platform,
            "inputs": [spec.to_dict() for spec in self.inputs()],
            "outputs": [spec.to_dict() for spec in self.outputs()],
        }


def threads_from_environment() -> int:
    """The intra-op threads a worker's environment allows (``OMP_NUM_THREADS``, which the
    worker sets to its share of the cores; 0: not set, the library's own choice)."""
    try:
        return max(0, int(os.environ.get("OMP_NUM_THREADS", "0")))
    except ValueError:
        return 0
