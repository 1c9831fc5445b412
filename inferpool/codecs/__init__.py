"""Content-type codecs: V2 tensors to the Python objects models want, and back."""

from inferpool.codecs.base import InputCodec
from inferpool.codecs.registry import decode_input, encode_output, find_input_codec

__all__ = ["InputCodec", "decode_input", "encode_output", "find_input_codec"]
