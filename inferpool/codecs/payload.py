"""Request-level decoding: a whole request to the payload a runtime ``accepts``.

The engine converts once, here: the request's own ``content_type`` (a request codec)
wins over what the runtime accepts. A model-wide ``parameters.content_type`` from
model-settings.json stands in for a request that carries none (MLServer's rule); when it
names an input codec (``str``, ``base64`` ...) it is the default of every input that has no
content type of its own, neither in the request nor in the model's metadata.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from inferpool.codecs.dict_codec import DictCodec
from inferpool.codecs.pandas import PandasCodec, frame
from inferpool.codecs.registry import decode_input, find_request_codec, is_input_content_type
from inferpool.errors import BadRequest, ModelLoadError
from inferpool.protocol.types import InferenceRequest

# Request-level content types that ask for a plain array (besides the request codecs).
ARRAY_CONTENT_TYPES = ("np", "ndarray", "numpy")
# The payload kind each request codec gives.
_PAYLOAD_KIND = {PandasCodec: "dataframe", DictCodec: "dict"}


def payload_kind(content_type: str) -> str:
    """The payload kind a request-level content type asks for; 400 if unknown."""
    if content_type in ARRAY_CONTENT_TYPES:
        return "array"
    try:
        return _PAYLOAD_KIND[find_request_codec(content_type)]
    except BadRequest as exc:
        raise BadRequest(f"{exc.message}, {', '.join(ARRAY_CONTENT_TYPES)}") from None


def check_model_content_type(content_type: str | None) -> None:
    """A model-wide content type must be a request or an input content type we know."""
    if content_type is None or is_input_content_type(content_type):
        return
    try:
        payload_kind(content_type)
    except BadRequest as exc:
        message = exc.message.replace("request: unknown", "unknown", 1)
        raise ModelLoadError(f"parameters.content_type in model-settings.json: {message}") from None


def decode_payload(
    request: InferenceRequest,
    accepts: str,
    default_content_types: dict[str, str],
    column_names: list[str] | None = None,
    model_content_type: str | None = None,
) -> Any:
    """Decode ``request`` into the runtime's payload kind; the request may override it,
    except for a runtime that takes the request itself (its content type is then the
    runtime's to read, as an MLServer custom runtime's ``decode_request`` does).
    ``model_content_type`` is the model-wide default (checked at load)."""
    if accepts == "request":
        return request
    content_type = request.content_type
    if content_type is None and model_content_type is not None:
        if is_input_content_type(model_content_type):
            default_content_types = {
                **{tensor.name: model_content_type for tensor in request.inputs},
                **default_content_types,
            }
        else:
            content_type = model_content_type
    if content_type is not None:
        accepts = payload_kind(content_type)
    if accepts == "dataframe":
        single = _single_matrix_frame(request, column_names, default_content_types)
        if single is not None:
            return single
        return PandasCodec.decode(request.inputs, default_content_types, decode_input)
    decoded = DictCodec.decode(request.inputs, default_content_types, decode_input)
    if accepts == "dict":
        return decoded
    return _array(decoded)


def _single_matrix_frame(
    request: InferenceRequest, column_names: list[str] | None, defaults: dict[str, str]
) -> Any:
    """One [rows, k] input for a model whose k inputs are its feature names: the frame
    with those names (how clients send a whole table to a DataFrame model)."""
    if len(request.inputs) != 1 or not column_names:
        return None
    (tensor,) = request.inputs
    if tensor.name in column_names or len(tensor.shape) != 2:
        return None
    if tensor.shape[1] != len(column_names):
        return None
    value = np.asarray(decode_input(tensor, defaults.get(tensor.name)))
    return frame({name: value[:, j] for j, name in enumerate(column_names)})


def _array(decoded: dict[str, Any]) -> Any:
    if len(decoded) == 1:
        return next(iter(decoded.values()))
    # Several inputs side by side, one or more columns each: the same rows, in order.
    columns = [_as_rows(name, np.asarray(value)) for name, value in decoded.items()]
    rows = {name: len(col) for name, col in columns}
    if len(set(rows.values())) > 1:
        detail = ", ".join(f"'{n}' has {r}" for n, r in rows.items())
        raise BadRequest(f"inputs must have the same number of rows: {detail}")
    return np.concatenate([c for _, c in columns], axis=1)


def _as_rows(name: str, value: np.ndarray) -> tuple[str, np.ndarray]:
    if value.ndim == 0:
        raise BadRequest(f"input '{name}' is a scalar; inputs need a first (row) dimension")
    # The column count from the shape, not -1: numpy cannot infer it for zero rows.
    return name, value.reshape(value.shape[0], math.prod(value.shape[1:]))
