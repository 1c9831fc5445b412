"""KServe V1's ``:predict`` and ``:explain`` in the workers: a V1 body in, converted to
the model's V2 request (``codecs/kserve_v1.py``), run through the model's ordinary
inference path (``inference.infer``) or its explanation (``explain.py``), answered in
KServe's JSON.

The output is what KServe's server of the model's kind calls: a pickled estimator's
``predict`` (sklearnserver), its ``predict_proba`` with KServe's ``PREDICT_PROBA=true`` in
the server's environment (sklearnserver's switch); a bare XGBoost or LightGBM Booster's
own ``predict`` (xgbserver, lgbserver), which gives a classifier's probabilities: the
positive class's alone for a binary one.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from inferpool.codecs import kserve_v1 as codec
from inferpool.engine.worker import inference
from inferpool.engine.worker.explain import explain
from inferpool.engine.worker.model import LoadedModel
from inferpool.protocol import kserve_v1 as protocol
from inferpool.protocol.types import InferenceRequest

PREDICT_PROBA = "PREDICT_PROBA"  # KServe's sklearnserver reads the same variable
PROBA = "predict_proba"


def v1_endpoint(name: str, model: LoadedModel) -> Callable[[bytes], bytes] | None:
    """The handler of the internal V1 endpoint ``name``, or None for another name."""
    if name == protocol.PREDICT:
        return lambda body: _predict(model, body)
    if name == protocol.EXPLAIN:
        return lambda body: codec.explanations(explain(model, _request(model, body)))
    return None


def _predict(model: LoadedModel, body: bytes) -> bytes:
    outputs, positive = _outputs(model)
    response = inference.infer(model, _request(model, body, outputs))
    return codec.predictions(response, positive)


def _request(model: LoadedModel, body: bytes, outputs: list[str] | None = None) -> InferenceRequest:
    return codec.to_request(protocol.instances(body), model.metadata["inputs"], outputs)


def _outputs(model: LoadedModel) -> tuple[list[str] | None, bool]:
    """The outputs to ask for (None: the model's default) and whether a binary
    classifier's probabilities are answered as the positive class's alone."""
    if PROBA not in model.output_names:
        return None, False
    runtime = model.runtime
    if getattr(runtime, "bare_booster", False) and getattr(runtime, "has_probabilities", False):
        return [PROBA], True
    if os.environ.get(PREDICT_PROBA, "false").lower() == "true":  # per request, as KServe
        return [PROBA], False
    return None, False
