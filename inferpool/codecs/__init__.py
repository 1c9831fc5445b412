"""Content-type codecs: V2 tensors to the Python objects models want, and back."""

from inferpool.codecs.base import InputCodec, RequestCodec
from inferpool.codecs.registry import (
    decode_input,
    decode_output,
    decode_response,
    encode_output,
    encode_outputs,
    find_input_codec,
    find_request_codec,
)

__all__ = [
    "InputCodec",
    "RequestCodec",
    "decode_input",
    "decode_output",
    "decode_response",
    "encode_output",
    "encode_outputs",
    "find_input_codec",
    "find_request_codec",
]
