"""How ``MLModel.decode``/``encode`` pick a codec (the tensor's content type, then the model's
metadata), where a decoded payload is kept (in the tensor's parameters, so it is decoded
once), and the single-input request codec that ``np`` and ``str`` requests use.
"""

from __future__ import annotations

from typing import Any

from inferpool.mlserver.codecs.base import (
    InputCodecLike,
    RequestCodec,
    RequestCodecLike,
    find_input_codec,
    find_input_codec_by_payload,
    find_request_codec,
    find_request_codec_by_payload,
)
from inferpool.mlserver.codecs.errors import CodecError
from inferpool.mlserver.settings import ModelSettings
from inferpool.mlserver.types import (
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
)

DefaultOutputPrefix = "output-"
DefaultInputPrefix = "input-"
DecodedParameterName = "_decoded_payload"

InputOrOutput = RequestInput | ResponseOutput
Codec = InputCodecLike | RequestCodecLike
Parametrised = InferenceRequest | RequestInput | RequestOutput | ResponseOutput | InferenceResponse
Tagged = MetadataTensor | ModelSettings


def inject_batch_dimension(shape: list[int]) -> list[int]:
    """A one-dimensional shape ``[N]`` as ``[N, 1]``; longer shapes as they are."""
    return shape if len(shape) > 1 else [*shape, 1]


def _content_type(item: Parametrised, metadata: Tagged | None = None) -> str | None:
    if item.parameters is not None and item.parameters.content_type:
        return item.parameters.content_type
    if metadata is not None and metadata.parameters and metadata.parameters.content_type:
        return metadata.parameters.content_type
    return None


def _save_decoded(item: Parametrised, decoded: Any) -> None:
    if item.parameters is None:
        item.parameters = Parameters()
    setattr(item.parameters, DecodedParameterName, decoded)


def has_decoded(item: Parametrised) -> bool:
    return item.parameters is not None and hasattr(item.parameters, DecodedParameterName)


def get_decoded(item: Parametrised) -> Any:
    if has_decoded(item):
        return getattr(item.parameters, DecodedParameterName)
    return None


def get_decoded_or_raw(item: Parametrised) -> Any:
    """The decoded payload if there is one, else a tensor's data or the object itself."""
    if has_decoded(item):
        return get_decoded(item)
    if isinstance(item, RequestInput | ResponseOutput):
        return item.data
    return item


def encode_response_output(
    payload: Any,
    request_output: RequestOutput,
    metadata_outputs: dict[str, MetadataTensor] | None = None,
) -> ResponseOutput | None:
    """The output by its requested (or declared) content type, else by the payload's type."""
    metadata = (metadata_outputs or {}).get(request_output.name)
    content_type = _content_type(request_output, metadata)
    codec = find_input_codec(content_type) if content_type else find_input_codec_by_payload(payload)
    if codec is None:
        return None
    output: ResponseOutput = codec.encode_output(name=request_output.name, payload=payload)
    return output


def encode_inference_response(
    payload: Any, model_settings: ModelSettings
) -> InferenceResponse | None:
    """The response by the request codec that fits the payload's type, if one does."""
    codec = find_request_codec_by_payload(payload)
    if codec is None:
        return None
    version = model_settings.parameters.version if model_settings.parameters else None
    response: InferenceResponse = codec.encode_response(model_settings.name, payload, version)
    return response


def decode_request_input(
    request_input: RequestInput, metadata_inputs: dict[str, MetadataTensor] | None = None
) -> Any:
    """Decode an input by its content type or its declared one (kept on the input)."""
    metadata = (metadata_inputs or {}).get(request_input.name)
    content_type = _content_type(request_input, metadata)
    if content_type is None:
        return None
    codec = find_input_codec(content_type)
    if codec is None:
        return None
    decoded = codec.decode_input(request_input)
    _save_decoded(request_input, decoded)
    return decoded


def decode_inference_request(
    inference_request: InferenceRequest,
    model_settings: ModelSettings | None = None,
    metadata_inputs: dict[str, MetadataTensor] | None = None,
) -> Any:
    """Decode every input that has a content type, then the request by its own content
    type or the model's default (``parameters.content_type``); else the request itself."""
    for request_input in inference_request.inputs:
        decode_request_input(request_input, metadata_inputs)
    content_type = _content_type(inference_request, model_settings)
    if content_type is not None:
        codec = find_request_codec(content_type)
        if codec is not None:
            decoded = codec.decode_request(inference_request)
            _save_decoded(inference_request, decoded)
            return decoded
    return inference_request


class SingleInputRequestCodec(RequestCodec):
    """A request codec whose request is its one input, decoded by ``InputCodec``."""

    InputCodec: Any = None

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return cls.InputCodec is not None and bool(cls.InputCodec.can_encode(payload))

    @classmethod
    def _input_codec(cls) -> Any:
        if cls.InputCodec is None:
            raise NotImplementedError(f"No input codec found for {type(cls)} request codec")
        return cls.InputCodec

    @classmethod
    def encode_response(
        cls, model_name: str, payload: Any, model_version: str | None = None, **kwargs: Any
    ) -> InferenceResponse:
        output = cls._input_codec().encode_output(f"{DefaultOutputPrefix}1", payload, **kwargs)
        return InferenceResponse(
            model_name=model_name,
            model_version=model_version,
            parameters=Parameters(content_type=cls.ContentType),
            outputs=[output],
        )

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> Any:
        return cls._decode_single(response.outputs, "output", "decode_output")

    @classmethod
    def encode_request(cls, payload: Any, **kwargs: Any) -> InferenceRequest:
        tensor = cls._input_codec().encode_input(f"{DefaultInputPrefix}1", payload, **kwargs)
        return InferenceRequest(
            inputs=[tensor], parameters=Parameters(content_type=cls.ContentType)
        )

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> Any:
        return cls._decode_single(request.inputs, "input", "decode_input")

    @classmethod
    def _decode_single(cls, tensors: list[Any], kind: str, method: str) -> Any:
        if len(tensors) != 1:
            raise CodecError(
                f"The '{cls.ContentType}' codec only supports a single {kind} tensor "
                f"({len(tensors)} were received)"
            )
        (tensor,) = tensors
        if not has_decoded(tensor) and cls.InputCodec is not None:
            _save_decoded(tensor, getattr(cls.InputCodec, method)(tensor))
        return get_decoded_or_raw(tensor)
