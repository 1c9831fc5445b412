"""The inference path for one loaded model: decode → predict → encode, in three steps.

The steps are separate so that adaptive batching can prepare several requests, predict
once on their concatenation, and split the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferpool.codecs.payload import decode_payload
from inferpool.codecs.registry import encode_outputs
from inferpool.engine.model import LoadedModel
from inferpool.errors import BadRequest, InferpoolError, ModelError
from inferpool.protocol.rest_json import new_request_id
from inferpool.protocol.types import InferenceRequest, InferenceResponse

# Request parameters that describe the request's own encoding, not the response's.
_REQUEST_ONLY = frozenset({"content_type", "binary_data_output"})


def prepare(model: LoadedModel, request: InferenceRequest) -> tuple[Any, list[str]]:
    """The runtime's payload and the output names to compute; 400 for what cannot fit."""
    runtime = model.runtime
    column_names = [spec["name"] for spec in model.metadata["inputs"]]
    payload = decode_payload(request, runtime.accepts, model.input_content_types, column_names)
    runtime.validate(payload)
    return payload, requested_outputs(model, request)


def requested_outputs(model: LoadedModel, request: InferenceRequest) -> list[str]:
    if not request.outputs:
        return model.runtime.default_outputs()
    names = [output.name for output in request.outputs]
    unknown = [name for name in names if name not in model.output_names]
    if unknown:
        raise BadRequest(
            f"model '{model.name}' has no output {', '.join(repr(n) for n in unknown)}; "
            f"available: {', '.join(model.output_names)}"
        )
    return names


def predict(model: LoadedModel, payload: Any, outputs: list[str]) -> Mapping[str, Any]:
    """Run the runtime; anything it raises becomes a 500 with a one-line message."""
    try:
        result = model.runtime.predict(payload, outputs)
    except InferpoolError:
        raise
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ModelError(f"model '{model.name}' raised {type(exc).__name__}: {message}") from None
    if not isinstance(result, Mapping):
        return {outputs[0]: result}
    return result


def respond(
    model: LoadedModel, request: InferenceRequest, result: Mapping[str, Any]
) -> InferenceResponse:
    outputs, content_type = encode_outputs(result)
    # Echo the request's parameters, except those that described the request itself.
    parameters = {k: v for k, v in request.parameters.items() if k not in _REQUEST_ONLY}
    if content_type is not None:
        parameters["content_type"] = content_type
    return InferenceResponse(
        model_name=model.name,
        model_version=model.settings.version,
        id=request.id or new_request_id(),
        parameters=parameters,
        outputs=outputs,
    )


def infer(model: LoadedModel, request: InferenceRequest) -> InferenceResponse:
    """The whole path for one request, for embedded use and tests."""
    payload, outputs = prepare(model, request)
    return respond(model, request, predict(model, payload, outputs))
