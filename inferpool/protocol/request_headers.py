"""How a request's HTTP headers or gRPC metadata reach a runtime that takes the request:
as ``parameters.headers`` (a name → value object), MLServer's place for them.

Only a model whose runtime is a user's class (``ModelStatus.custom``) gets them, so the
built-in runtimes never pay: for such a model the frontend sends the body as
``Kind.REST_HEADERS`` / ``Kind.GRPC_HEADERS``, the headers block in front of the V2 body
(``wrap``), and the worker's wire format for that kind (``rest_headers_wire``,
``grpc_headers_wire``) decodes the body as usual and sets the headers (``with_headers``).
As MLServer does, they replace whatever ``parameters.headers`` the request carried.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import orjson

from inferpool.errors import BadRequest
from inferpool.protocol.types import InferenceRequest

# The block's length in front of it: 4 bytes, big-endian.
_LENGTH = 4
HEADERS = "headers"

Decoder = Callable[[bytes, int | None], InferenceRequest]


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
