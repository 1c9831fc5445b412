"""The codec interfaces of ``mlserver.codecs`` and the registry that finds a codec by content
type, by the payload to encode, or by a type hint (for ``decode_args``).

Codecs are stateless classes registered under their ``ContentType``; the first registered
codec that matches a payload or a type hint wins, in registration order.
"""

from __future__ import annotations

import logging
import typing
from typing import Any, ClassVar, TypeAlias

from inferpool.mlserver.types import (
    InferenceRequest,
    InferenceResponse,
    RequestInput,
    ResponseOutput,
)

logger = logging.getLogger(__name__)


class InputCodec:
    """Converts one input (output) tensor to a Python object and back."""

    ContentType: ClassVar[str] = ""
    TypeHint: ClassVar[Any] = type(None)

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return False

    @classmethod
    def encode(cls, name: str, payload: Any) -> ResponseOutput:
        """Deprecated in MLServer: ``encode_output``."""
        logger.warning("DEPRECATED! The encode() method is now deprecated. Use encode_output()")
        return cls.encode_output(name, payload)

    @classmethod
    def encode_output(cls, name: str, payload: Any, **kwargs: Any) -> ResponseOutput:
        raise NotImplementedError()

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> Any:
        raise NotImplementedError()

    @classmethod
    def encode_input(cls, name: str, payload: Any, **kwargs: Any) -> RequestInput:
        raise NotImplementedError()

    @classmethod
    def decode(cls, request_input: RequestInput) -> Any:
        """Deprecated in MLServer: ``decode_input``."""
        logger.warning("DEPRECATED! The decode() method is now deprecated. Use decode_input()")
        return cls.decode_input(request_input)

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> Any:
        raise NotImplementedError()


class RequestCodec:
    """Converts all the inputs of a request (outputs of a response) to one object and back."""

    ContentType: ClassVar[str] = ""
    TypeHint: ClassVar[Any] = type(None)

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return False

    @classmethod
    def encode(
        cls, model_name: str, payload: Any, model_version: str | None = None
    ) -> InferenceResponse:
        """Deprecated in MLServer: ``encode_response``."""
        logger.warning("DEPRECATED! The encode() method is now deprecated. Use encode_response()")
        return cls.encode_response(model_name, payload, model_version)

    @classmethod
    def encode_response(
        cls, model_name: str, payload: Any, model_version: str | None = None, **kwargs: Any
    ) -> InferenceResponse:
        raise NotImplementedError()

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> Any:
        raise NotImplementedError()

    @classmethod
    def encode_request(cls, payload: Any, **kwargs: Any) -> InferenceRequest:
        raise NotImplementedError()

    @classmethod
    def decode(cls, request: InferenceRequest) -> Any:
        """Deprecated in MLServer: ``decode_request``."""
        logger.warning("DEPRECATED! The decode() method is now deprecated. Use decode_request()")
        return cls.decode_request(request)

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> Any:
        raise NotImplementedError()


InputCodecLike: TypeAlias = type[InputCodec] | InputCodec
RequestCodecLike: TypeAlias = type[RequestCodec] | RequestCodec

_input_codecs: dict[str, InputCodecLike] = {}
_request_codecs: dict[str, RequestCodecLike] = {}


def _first(candidates: list[Any], what: str) -> Any:
    if not candidates:
        logger.warning("No codec was found for %s.", what)
        return None
    if len(candidates) > 1:
        logger.warning(
            "Multiple codecs (%d were found for %s. The first one found will be used (%s).",
            len(candidates),
            what,
            candidates[0].ContentType,
        )
    return candidates[0]


def _hint_key(hint: Any) -> Any:
    """``List[str]`` and ``list[str]`` name the same type: compare origin and arguments."""
    return (typing.get_origin(hint) or hint, typing.get_args(hint))


def _find(codecs: dict[str, Any], content_type: str | None, payload: Any, type_hint: Any) -> Any:
    if content_type:
        return codecs.get(content_type)
    if payload is not None:
        matches = [codec for codec in codecs.values() if codec.can_encode(payload)]
        return _first(matches, f"payload with type {type(payload)}")
    if type_hint is not None:
        wanted = _hint_key(type_hint)
        matches = [codec for codec in codecs.values() if _hint_key(codec.TypeHint) == wanted]
        return _first(matches, f"type hint {type_hint}")
    return None


def find_input_codec(
    content_type: str | None = None, payload: Any = None, type_hint: Any = None
) -> InputCodecLike | None:
    """The input codec for a content type, else for a payload, else for a type hint."""
    codec: InputCodecLike | None = _find(_input_codecs, content_type, payload, type_hint)
    return codec


def find_request_codec(
    content_type: str | None = None, payload: Any = None, type_hint: Any = None
) -> RequestCodecLike | None:
    """The request codec for a content type, else for a payload, else for a type hint."""
    codec: RequestCodecLike | None = _find(_request_codecs, content_type, payload, type_hint)
    return codec


def find_input_codec_by_payload(payload: Any) -> InputCodecLike | None:
    codec: InputCodecLike | None = _find(_input_codecs, None, payload, None)
    return codec


def find_request_codec_by_payload(payload: Any) -> RequestCodecLike | None:
    codec: RequestCodecLike | None = _find(_request_codecs, None, payload, None)
    return codec


def register_input_codec(codec: Any) -> Any:
    """Class decorator: make ``codec`` answer its ``ContentType`` on inputs and outputs."""
    if codec.ContentType is not None:
        _input_codecs[codec.ContentType] = codec
    return codec


def register_request_codec(codec: Any) -> Any:
    """Class decorator: make ``codec`` answer its ``ContentType`` on requests and responses."""
    if codec.ContentType is not None:
        _request_codecs[codec.ContentType] = codec
    return codec
