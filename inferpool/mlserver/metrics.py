"""``mlserver.register`` and ``mlserver.log``: MLServer's custom metrics, as inferpool's.

As in MLServer 1.7.1, a metric is a histogram of the values logged (default buckets),
labelled with the model's name and version, registered on first use if ``register`` was
not called; both work only inside the model's ``load``/``predict`` (the model they belong
to is the one running). They are the model's ``self.metrics.histogram(...)``: exported
with the labels ``model`` and ``version`` and summed across workers.
"""

from __future__ import annotations

from contextvars import ContextVar

from inferpool.mlserver.errors import MLServerError
from inferpool.runtimes.metrics import Histogram, ModelMetrics

# The metrics of the model whose coroutine runs (set by inferpool.mlserver.adapter.runtime).
current_model: ContextVar[ModelMetrics] = ContextVar("inferpool_mlserver_model")

_DEFAULT_DESCRIPTION = "logged with mlserver.log()"


def _metrics() -> ModelMetrics:
    try:
        return current_model.get()
    except LookupError:
        raise MLServerError(
            "Contextual method (e.g. mlserver.log() or mlserver.register()) was called "
            "outside of a model context.",
            500,
        ) from None


def register(name: str, description: str) -> Histogram:
    """The model's histogram ``name``, defined now unless it already is."""
    metrics = _metrics()
    existing = metrics.metrics.get(name)
    if isinstance(existing, Histogram):
        return existing
    return metrics.histogram(name, description)


def log(**metrics: float) -> None:
    """Observe each value in the histogram of its name (registered if need be)."""
    for name, value in metrics.items():
        register(name, _DEFAULT_DESCRIPTION).observe(value)
