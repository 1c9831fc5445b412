"""The ``explain`` endpoint in the workers: a V2 request in, a V2 response of the model's
attributions out (``runtimes/explain.py`` says what they hold).

The request is decoded and checked as ``/infer`` does (``inference.prepare``: the same
inputs, content types and input checks); its ``outputs`` are not the model's and are
ignored. Any model answers the endpoint unless its runtime registers its own
``explain`` custom endpoint; one whose runtime cannot explain answers 400, saying why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from inferpool.engine.worker import inference
from inferpool.engine.worker.model import LoadedModel
from inferpool.errors import BadRequest
from inferpool.protocol import rest_json
from inferpool.protocol.endpoints import EXPLAIN
from inferpool.protocol.types import InferenceRequest, InferenceResponse, Tensor
from inferpool.runtimes.explain import OUTPUT, CannotExplain


def explain_endpoint(name: str, model: LoadedModel) -> Callable[[bytes], bytes] | None:
    """The REST endpoint ``name`` answers for ``model`` when its runtime has none of its
    own of that name: a JSON V2 request body in, a JSON V2 response out."""
    if name != EXPLAIN:
        return None
    return lambda body: rest_json.encode_response(explain(model, rest_json.decode_request(body)))


def explain(model: LoadedModel, request: InferenceRequest) -> InferenceResponse:
    """The model's attributions for ``request`` as a V2 response of one output."""
    return inference.respond(model, request, {OUTPUT: attributions(model, request)})


def attributions(model: LoadedModel, request: InferenceRequest) -> Tensor:
    """The ``contributions`` output for ``request``; 400 when the model cannot explain."""
    payload, _ = inference.prepare(model, dataclasses.replace(request, outputs=[]))
    try:
        explained = model.runtime.explain(payload)
    except CannotExplain as exc:
        raise BadRequest(f"model '{model.name}' cannot explain: {exc.message}") from None
    except Exception as exc:
        raise inference.model_failure(model, exc, request) from None
    return explained.tensor()
