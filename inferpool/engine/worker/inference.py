"""The inference path for one loaded model: decode → predict → encode, in three steps.

The steps are separate so that the worker path (``path.py``) can prepare several
requests, predict once on their concatenation, and split the result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from inferpool.codecs.image import decode_declared, encode_declared
from inferpool.codecs.payload import decode_payload
from inferpool.codecs.registry import encode_outputs
from inferpool.engine.ipc.messages import explain_memory_error
from inferpool.engine.worker.model import LoadedModel
from inferpool.errors import BadRequest, InferpoolError, ModelError
from inferpool.protocol.rest_json import new_request_id
from inferpool.protocol.types import InferenceRequest, InferenceResponse, RequestedOutput
from inferpool.runtimes.base import Answer

# Request parameters that describe the request's own encoding, not the response's (and
# its headers, which a custom runtime reads but the response never echoes).
_REQUEST_ONLY = frozenset({"content_type", "binary_data_output", "headers"})


def prepare(model: LoadedModel, request: InferenceRequest) -> tuple[Any, list[str]]:
    """The runtime's payload and the output names to compute; 400 for what cannot fit."""
    runtime = model.runtime
    inputs = request.inputs
    if len(inputs) > 1 and len({tensor.name for tensor in inputs}) != len(inputs):
        raise BadRequest(f"input {_repeated(tensor.name for tensor in inputs)} appears twice")
    if model.image_inputs:
        decode_declared(inputs, model.image_inputs)
    column_names = [spec["name"] for spec in model.metadata["inputs"]]
    payload = decode_payload(
        request,
        runtime.accepts,
        model.input_content_types,
        column_names,
        model.settings.parameters.content_type,
    )
    try:
        runtime.validate(payload)
    except BadRequest as exc:
        # Our runtimes' messages ("model 'm' expects 4 features, got 3") get the input's
        # name; a message that names its input, or a custom runtime's own, stays as it is.
        if "input '" in exc.message or not exc.message.startswith(f"model '{model.name}' "):
            raise
        raise _rejected(model, request, exc.message) from None
    return payload, requested_outputs(model, request)


def _repeated(names: Iterable[str]) -> str:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return repr(name)
        seen.add(name)
    return ""


def _rejected(model: LoadedModel, request: InferenceRequest | None, detail: str) -> BadRequest:
    """``model 'm' rejected input 'x': <detail>`` (a detail may start with ``model 'm'``)."""
    own = f"model '{model.name}' "
    if detail.startswith(own):
        detail = detail[len(own) :]
    if request is None:
        return BadRequest(f"model '{model.name}' rejected its input: {detail}")
    names = [tensor.name for tensor in request.inputs]
    label = "input" if len(names) == 1 else "inputs"
    return BadRequest(
        f"model '{model.name}' rejected {label} {', '.join(repr(n) for n in names)}: {detail}"
    )


def requested_outputs(model: LoadedModel, request: InferenceRequest) -> list[str]:
    if not request.outputs:
        return model.runtime.default_outputs()
    names = [output.name for output in request.outputs]
    if len(names) > 1 and len(set(names)) != len(names):
        raise BadRequest(f"output {_repeated(names)} is requested twice")
    unknown = [name for name in names if name not in model.output_names]
    if unknown and not model.runtime.open_outputs:
        raise BadRequest(
            f"model '{model.name}' has no output {', '.join(repr(n) for n in unknown)}; "
            f"available: {', '.join(model.output_names)}"
        )
    return names


def predict(
    model: LoadedModel,
    payload: Any,
    outputs: list[str],
    request: InferenceRequest | None = None,
) -> Mapping[str, Any]:
    """Run the runtime; what it raises is answered as ``model_failure`` decides."""
    try:
        result = model.runtime.predict(payload, outputs)
    except Exception as exc:
        raise model_failure(model, exc, request) from None
    if not isinstance(result, Mapping):
        return {outputs[0]: result}
    return result


def model_failure(
    model: LoadedModel, exc: Exception, request: InferenceRequest | None = None
) -> InferpoolError:
    """The one place that decides what an exception out of ``predict`` answers.

    An InferpoolError keeps its status. An exception the runtime lists in
    ``input_errors`` (scikit-learn/LightGBM/XGBoost refusing the input) is the client's
    fault: 400 with the library's message, naming the input. Anything else is a fault
    of the model itself: 500.
    """
    if isinstance(exc, MemoryError):  # under a worker's memory limit: the 500 naming it
        exc = explain_memory_error(exc, model.name)
    if isinstance(exc, InferpoolError):
        return exc
    text = str(exc).strip()
    message = text.splitlines()[0] if text else ""
    if isinstance(exc, model.runtime.input_errors):
        return _rejected(model, request, message or type(exc).__name__)
    return ModelError(f"model '{model.name}' raised {type(exc).__name__}: {message}")


def respond(
    model: LoadedModel, request: InferenceRequest, result: Mapping[str, Any]
) -> InferenceResponse:
    """The response to ``request``: the result's outputs (only those the request names,
    when it names some), encoded, with the request's parameters echoed."""
    if request.outputs:
        result = only_requested(result, request.outputs)
    outputs, content_type = encode_outputs(
        encode_declared(result, model.image_outputs) if model.image_outputs else result
    )
    # Echo the request's parameters, except those that described the request itself.
    parameters = {k: v for k, v in request.parameters.items() if k not in _REQUEST_ONLY}
    if content_type is not None:
        parameters["content_type"] = content_type
    if type(result) is Answer:
        parameters.update(result.parameters)
    return InferenceResponse(
        model_name=model.name,
        model_version=model.settings.version,
        id=request.id or new_request_id(),
        parameters=parameters,
        outputs=outputs,
    )


def only_requested(
    result: Mapping[str, Any], requested: Sequence[RequestedOutput]
) -> Mapping[str, Any]:
    """The outputs of ``result`` the request names: the V2 protocol returns
    only the requested outputs, whatever else a runtime computed (a custom runtime's
    extra values). A result with none of them is kept whole: a runtime that answers
    under its own name whatever the request asks (``open_outputs``: MLServer's LightGBM
    and MLflow runtimes) still answers. ``prepare`` refused the names the model lacks."""
    kept = {output.name: result[output.name] for output in requested if output.name in result}
    if not kept or len(kept) == len(result):
        return result  # nothing to drop (or nothing named): the runtime's own mapping
    if type(result) is Answer:
        return Answer(kept, result.parameters)
    return kept


def infer(model: LoadedModel, request: InferenceRequest) -> InferenceResponse:
    """The whole path for one request, for embedded use and tests."""
    payload, outputs = prepare(model, request)
    return respond(model, request, predict(model, payload, outputs, request))
