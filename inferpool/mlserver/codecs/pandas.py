"""``pd``: a request (response) as a pandas DataFrame, one column per input (output).

A column of strings (bytes) travels as BYTES labelled ``str``; a column of other objects as
BYTES of JSON labelled ``pd_json``. NaN travels as null.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from inferpool.mlserver.codecs.base import RequestCodec, register_request_codec
from inferpool.mlserver.codecs.lists import as_list
from inferpool.mlserver.codecs.numpy import convert_nan, to_datatype, to_dtype
from inferpool.mlserver.codecs.string import StringCodec, decode_str, encode_str
from inferpool.mlserver.codecs.utils import (
    InputOrOutput,
    get_decoded_or_raw,
    inject_batch_dimension,
)
from inferpool.mlserver.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestInput,
    ResponseOutput,
)

JSON_CONTENT_TYPE = "pd_json"


class _ArrayJSONEncoder(json.JSONEncoder):
    def default(self, o: Any) -> Any:
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
        return super().default(o)


def encode_to_json(value: Any, use_bytes: bool = True) -> str | bytes:
    text = json.dumps(
        value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), cls=_ArrayJSONEncoder
    )
    return text.encode("utf-8") if use_bytes else text


def decode_json_input_or_output(tensor: InputOrOutput) -> list[Any]:
    return [json.loads(decode_str(item)) for item in as_list(tensor.data.root)]


def _to_series(tensor: InputOrOutput) -> pd.Series:
    parameters = tensor.parameters
    if parameters is not None and parameters.content_type == JSON_CONTENT_TYPE:
        return pd.Series(decode_json_input_or_output(tensor))
    payload = get_decoded_or_raw(tensor)
    if hasattr(payload, "root"):
        payload = payload.root
    if tensor.datatype in (Datatype.BYTES, "BYTES"):
        return pd.Series(payload)  # BYTES keep their elements' own types
    if isinstance(payload, np.ndarray):
        payload = payload.reshape(tensor.shape[0], 1).squeeze(axis=1)
    return pd.Series(payload, dtype=to_dtype(tensor))


def _strings(values: list[Any], use_bytes: bool) -> list[Any] | None:
    """The elements of a column of strings or bytes, encoded; None for another column."""
    if not all(isinstance(value, str | bytes) for value in values):
        return None
    return [encode_str(v) if use_bytes and isinstance(v, str) else v for v in values]


def _to_response_output(series: pd.Series, use_bytes: bool = True) -> ResponseOutput:
    datatype = to_datatype(series.dtype)
    data = series.tolist()
    if series.isnull().any():
        data = [convert_nan(value) for value in data]
    content_type = None
    if datatype == Datatype.BYTES:
        strings = _strings(data, use_bytes)
        if strings is None:
            data = [encode_to_json(value, use_bytes) for value in data]
            content_type = JSON_CONTENT_TYPE
        else:
            data = strings
            content_type = StringCodec.ContentType
    return ResponseOutput(
        name=str(series.name),
        shape=inject_batch_dimension(list(series.shape)),
        data=data,
        datatype=datatype,
        parameters=Parameters(content_type=content_type) if content_type else None,
    )


@register_request_codec
class PandasCodec(RequestCodec):
    """A request (response) as a DataFrame whose columns are its inputs (outputs)."""

    ContentType = "pd"
    JsonContentType = JSON_CONTENT_TYPE
    TypeHint = pd.DataFrame

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return isinstance(payload, pd.DataFrame)

    @classmethod
    def encode_response(
        cls,
        model_name: str,
        payload: pd.DataFrame,
        model_version: str | None = None,
        use_bytes: bool = True,
        **kwargs: Any,
    ) -> InferenceResponse:
        return InferenceResponse(
            model_name=model_name,
            model_version=model_version,
            parameters=Parameters(content_type=cls.ContentType),
            outputs=cls.encode_outputs(payload, use_bytes=use_bytes),
        )

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> pd.DataFrame:
        return pd.DataFrame({output.name: _to_series(output) for output in response.outputs})

    @classmethod
    def encode_outputs(cls, payload: pd.DataFrame, use_bytes: bool = True) -> list[ResponseOutput]:
        return [_to_response_output(payload[column], use_bytes) for column in payload]

    @classmethod
    def encode_request(
        cls, payload: pd.DataFrame, use_bytes: bool = True, **kwargs: Any
    ) -> InferenceRequest:
        outputs = cls.encode_outputs(payload, use_bytes=use_bytes)
        return InferenceRequest(
            parameters=Parameters(content_type=cls.ContentType),
            inputs=[RequestInput(**dict(output)) for output in outputs],
        )

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> pd.DataFrame:
        return pd.DataFrame({tensor.name: _to_series(tensor) for tensor in request.inputs})
