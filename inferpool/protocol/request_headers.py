"""How a request's HTTP headers or gRPC metadata reach a runtime that takes the request:
as ``parameters.headers`` (a name → value object), MLServer's place for them.

Only a model whose runtime is a user's class (``ModelStatus.custom``) gets them, so the
built-in runtimes never pay: for such a model the frontend sends the body as
``Kind.REST_HEADERS`` / ``Kind.GRPC_HEADERS``, the headers block in front of the V2 body
(``wrap``), and the worker's wire format for that kind (``rest_headers_wire``,
``grpc_headers_wire`` beside this module) decodes the body as usual and sets the headers
(``with_headers``).
As MLServer does, they replace whatever ``parameters.headers`` the request carried.

The way back is the same block: a response's ``parameters.headers`` (a name → value
object the runtime set, as MLServer's ``InferenceResponse.parameters.headers``) leaves the
JSON or protobuf body and travels in front of it (``with_response_headers``); the frontend
takes it off (``unwrap``) and sends it as HTTP response headers, or gRPC trailing
metadata, as MLServer 1.7.1 does.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from inferpool.errors import BadRequest
from inferpool.protocol.types import InferenceRequest, InferenceResponse
from inferpool.protocol.wire_format import Decoder, Encoder

# The block's length in front of it: 4 bytes, big-endian.
_LENGTH = 4
HEADERS = "headers"


def http_headers(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """HTTP headers (names lower-cased by the server) as a name → value object; of a name
    sent twice, the first value (as ``dict(starlette_request.headers)`` has it)."""
    found: dict[str, str] = {}
    for name, value in headers:
        found.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return found


def grpc_metadata(metadata: Iterable[tuple[str | bytes, str | bytes]]) -> dict[str, str]:
    """gRPC invocation metadata (grpc.aio's str keys, or the HTTP/2 layer's raw bytes) as a
    name → value object, without HTTP/2's pseudo-headers; of a key sent twice, the last
    value (as MLServer's servicer has it). A binary value (``-bin`` key) is kept as its
    latin-1 text, so every value is a string."""
    found: dict[str, str] = {}
    for key, value in metadata:
        name = key.decode("latin-1") if isinstance(key, bytes) else key
        if name.startswith(":"):
            continue
        found[name] = value.decode("latin-1") if isinstance(value, bytes) else value
    return found


def wrap(headers: dict[str, str], body: bytes) -> bytes:
    """The headers block, then the V2 body."""
    block = orjson.dumps(headers)
    return len(block).to_bytes(_LENGTH, "big") + block + body


def with_headers(decode: Decoder) -> Decoder:
    """A wire format's decoder for bodies that ``wrap`` made."""

    def decode_with_headers(body: bytes, json_length: int | None) -> InferenceRequest:
        size = int.from_bytes(body[:_LENGTH], "big")
        end = _LENGTH + size
        if len(body) < end:
            raise BadRequest("request headers block is truncated")  # only a bug sends this
        request = decode(body[end:], json_length)
        request.parameters[HEADERS] = orjson.loads(body[_LENGTH:end])
        return request

    return decode_with_headers


def with_response_headers(encode: Encoder) -> Encoder:
    """A wire format's encoder that moves the response's ``parameters.headers`` out of
    the body into a headers block in front of it (``wrap``; an empty block when none)."""

    def encode_with_headers(
        response: InferenceResponse, request: InferenceRequest
    ) -> tuple[bytes, int | None]:
        headers = response.parameters.get(HEADERS)
        found: dict[str, str] = {}
        if isinstance(headers, dict):  # MLServer takes them out of the body
            del response.parameters[HEADERS]
            found = {str(name): _header_text(value) for name, value in headers.items()}
        body, json_length = encode(response, request)
        return wrap(found, body), json_length

    return encode_with_headers


def _header_text(value: object) -> str:
    """A header's value as text on one line (a line break would end the header)."""
    text = value if isinstance(value, str) else str(value)
    return text.replace("\r", " ").replace("\n", " ")


def unwrap(body: bytes) -> tuple[dict[str, str], bytes]:
    """The headers block and the body that ``with_response_headers`` joined."""
    size = int.from_bytes(body[:_LENGTH], "big")
    end = _LENGTH + size
    return orjson.loads(body[_LENGTH:end]), body[end:]
