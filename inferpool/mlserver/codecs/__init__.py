"""MLServer's codecs (``mlserver.codecs``): content types ↔ Python objects on the pydantic
types of ``inferpool.mlserver.types``, for custom runtimes written against MLServer."""

from inferpool.mlserver.codecs.base import (
    InputCodec,
    InputCodecLike,
    RequestCodec,
    RequestCodecLike,
    find_input_codec,
    find_request_codec,
    register_input_codec,
    register_request_codec,
)
from inferpool.mlserver.codecs.base64 import Base64Codec
from inferpool.mlserver.codecs.datetime import DatetimeCodec
from inferpool.mlserver.codecs.decorator import decode_args
from inferpool.mlserver.codecs.errors import CodecError
from inferpool.mlserver.codecs.numpy import NumpyCodec, NumpyRequestCodec
from inferpool.mlserver.codecs.pandas import PandasCodec
from inferpool.mlserver.codecs.string import StringCodec, StringRequestCodec
from inferpool.mlserver.codecs.utils import (
    DecodedParameterName,
    decode_inference_request,
    decode_request_input,
    encode_inference_response,
    encode_response_output,
    get_decoded,
    get_decoded_or_raw,
    has_decoded,
)

__all__ = [
    "Base64Codec",
    "CodecError",
    "DatetimeCodec",
    "DecodedParameterName",
    "InputCodec",
    "InputCodecLike",
    "NumpyCodec",
    "NumpyRequestCodec",
    "PandasCodec",
    "RequestCodec",
    "RequestCodecLike",
    "StringCodec",
    "StringRequestCodec",
    "decode_args",
    "decode_inference_request",
    "decode_request_input",
    "encode_inference_response",
    "encode_response_output",
    "find_input_codec",
    "find_request_codec",
    "get_decoded",
    "get_decoded_or_raw",
    "has_decoded",
    "register_input_codec",
    "register_request_codec",
]
