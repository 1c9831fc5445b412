"""``@decode_args``: a ``predict`` that takes decoded arguments and returns Python values.

The codecs come from the method's type hints: each argument named like an input is decoded
by the input codec of its hint; inputs no argument names go, together, to the one argument
whose hint has a request codec (a DataFrame). Each returned value (a tuple returns several)
is encoded by the codec of its place in the return hint, as ``output-<index>``.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Awaitable, Callable
from typing import Any

from inferpool.mlserver.codecs.base import (
    InputCodec,
    RequestCodec,
    find_input_codec,
    find_request_codec,
)
from inferpool.mlserver.codecs.errors import CodecNotFound, InputsNotFound, OutputNotFound
from inferpool.mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


def _as_list(hint: Any) -> list[Any]:
    if hint is None:
        return []
    if isinstance(hint, tuple):
        return list(hint)
    if typing.get_origin(hint) is tuple:
        return list(typing.get_args(hint))
    return [hint]


def _is(codec: Any, base: type) -> bool:
    return (isinstance(codec, type) and issubclass(codec, base)) or isinstance(codec, base)


def _unwrap_optional(hint: Any) -> Any:
    """``X | None`` (``Optional[X]``) is taken as ``X``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


class SignatureCodec(RequestCodec):
    """Decodes a request into the arguments of ``predict``, and encodes what it returns."""

    def __init__(self, predict: Callable[..., Any]) -> None:
        hints = {name: _unwrap_optional(h) for name, h in typing.get_type_hints(predict).items()}
        self._output_hints = _as_list(hints.pop("return", None))
        self._input_hints = hints
        self._input_codecs = {
            name: self._find_codec(name, hint, is_input=True) for name, hint in hints.items()
        }
        self._output_codecs = [self._find_codec(None, h, False) for h in self._output_hints]

    @staticmethod
    def _find_codec(name: str | None, hint: Any, is_input: bool) -> Any:
        codec = find_input_codec(type_hint=hint) or find_request_codec(type_hint=hint)
        if codec is None:
            raise CodecNotFound(name=name, payload_type=str(hint), is_input=is_input)
        return codec

    def decode_request(self, request: InferenceRequest) -> dict[str, Any]:  # type: ignore[override]
        arguments: dict[str, Any] = {}
        rest = []
        for tensor in request.inputs:
            codec = self._input_codecs.get(tensor.name)
            if codec is None:
                rest.append(tensor)  # may be a column of a request-codec argument
                continue
            if not _is(codec, InputCodec):
                raise CodecNotFound(name=tensor.name, is_input=True)
            arguments[tensor.name] = codec.decode_input(tensor)
        if rest:
            aggregate = next(
                ((n, c) for n, c in self._input_codecs.items() if _is(c, RequestCodec)), None
            )
            if aggregate is None:
                raise InputsNotFound(rest, self._input_codecs)
            name, codec = aggregate
            arguments[name] = codec.decode_request(InferenceRequest(inputs=rest))
        return arguments

    def encode_response(  # type: ignore[override]
        self, model_name: str, payload: Any, model_version: str | None = None
    ) -> InferenceResponse:
        outputs: list[ResponseOutput] = []
        for index, value in enumerate(_as_list(payload)):
            outputs += self._encode(index, value)
        return InferenceResponse(
            model_name=model_name, model_version=model_version, outputs=outputs
        )

    def _encode(self, index: int, value: Any) -> list[ResponseOutput]:
        if index >= len(self._output_codecs) or not self._output_codecs[index].can_encode(value):
            raise OutputNotFound(index, type(value), self._output_hints)
        codec = self._output_codecs[index]
        if _is(codec, InputCodec):
            return [codec.encode_output(name=f"output-{index}", payload=value)]
        if _is(codec, RequestCodec):
            response = codec.encode_response(model_name="", payload=value)
            outputs: list[ResponseOutput] = response.outputs
            return outputs
        return []


def decode_args(
    predict: Callable[..., Awaitable[Any]],
) -> Callable[[Any, InferenceRequest], Awaitable[InferenceResponse]]:
    """Wrap ``async def predict(self, <input>: <hint>, ...) -> <hint>`` as an MLModel's
    ``predict(request) -> response``."""
    codec = SignatureCodec(predict)

    @functools.wraps(predict)
    async def wrapper(self: Any, request: InferenceRequest) -> InferenceResponse:
        values = await predict(self, **codec.decode_request(request))
        return codec.encode_response(self.name, values, self.version)

    return wrapper
