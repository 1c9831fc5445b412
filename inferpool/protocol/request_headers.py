"""How a request's HTTP headers or gRPC metadata reach a runtime that takes the request:
as ``parameters.headers`` (a name → value object), MLServer's place for them.

Only a model whose runtime is a user's class, or a built-in one whose registry entry says
so (``RuntimeEntry.headers``: the alibi runtimes), gets them
(``ModelStatus.exchanges_headers``), so the other built-in runtimes never pay: for such a
model the frontend sends the body as ``Kind.REST_HEADERS`` / ``Kind.GRPC_HEADERS``, the
headers block in front of the V2 body (``wrap``), and the worker's wire format for that
kind (``rest_headers_wire``, ``grpc_headers_wire`` beside this module) decodes the body as
usual and sets the headers (``with_headers``).
As MLServer does, they replace whatever ``parameters.headers`` the request carried.

The way back is the same block: a response's ``parameters.headers`` (a name → value
object the runtime set, as MLServer's ``InferenceResponse.parameters.headers``) leaves the
JSON or protobuf body and travels in front of it (``with_response_headers``); the frontend
takes it off (``unwrap``) and sends it as HTTP response headers, or gRPC trailing
metadata, as MLServer 1.7.1 does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

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


def headers_block(headers: dict[str, str], padding: int = 0) -> bytes:
    """The headers block with its length in front: what ``wrap`` puts before a body;
    ``padding`` spaces after its JSON (to align what follows)."""
    block = orjson.dumps(headers) + b" " * padding if padding else orjson.dumps(headers)
    return len(block).to_bytes(_LENGTH, "big") + block


def wrap(headers: dict[str, str], body: bytes) -> bytes:
    """The headers block, then the V2 body (a copy of it: the REST route reads a large
    body behind its block instead, ``read_body``'s ``prefix``)."""
    return headers_block(headers) + body


def _after_block(body: bytes) -> tuple[int, bytes]:
    """Where the body behind a headers block starts, and that body: a view of a large
    one (at least ``VIEW_FROM`` bytes) rather than a copy."""
    end = _LENGTH + int.from_bytes(body[:_LENGTH], "big")
    if len(body) >= VIEW_FROM:
        return end, memoryview(body)[end:]  # type: ignore[return-value]  # bytes-like
    return end, body[end:]


# Bodies from this size on are cut by a view; smaller ones by a slice (a copy cheaper
# than a view's object for what reads them next).
VIEW_FROM = 1 << 20


def with_headers(decode: Decoder) -> Decoder:
    """A wire format's decoder for bodies that ``wrap`` made."""

    def decode_with_headers(body: bytes, json_length: int | None) -> InferenceRequest:
        end, rest = _after_block(body)
        if len(body) < end:
            raise BadRequest("request headers block is truncated")  # only a bug sends this
        request = decode(rest, json_length)
        request.parameters[HEADERS] = orjson.loads(body[_LENGTH:end])
        return request

    return decode_with_headers


PrefixedEncoder = Callable[[InferenceResponse, InferenceRequest, bytes], tuple[bytes, int | None]]


def with_response_headers(encode: PrefixedEncoder) -> Encoder:
    """A wire format's encoder that moves the response's ``parameters.headers`` out of
    the body into a headers block in front of it (``wrap``; an empty block when none);
    ``encode`` writes the block in front of the body it makes, in the same join."""

    def encode_with_headers(
        response: InferenceResponse, request: InferenceRequest
    ) -> tuple[bytes, int | None]:
        headers = response.parameters.get(HEADERS)
        found: dict[str, str] = {}
        if isinstance(headers, dict):  # MLServer takes them out of the body
            del response.parameters[HEADERS]
            found = {str(name): _header_text(value) for name, value in headers.items()}
        return encode(response, request, headers_block(found))

    return encode_with_headers


def _header_text(value: object) -> str:
    """A header's value as text on one line (a line break would end the header)."""
    text = value if isinstance(value, str) else str(value)
    return text.replace("\r", " ").replace("\n", " ")


def unwrap(body: bytes, view: bool = False) -> tuple[dict[str, str], bytes]:
    """The headers block and the body that ``with_response_headers`` joined; ``view``: a
    large body as a view of ``body`` (for a caller that only writes it out)."""
    if view:
        end, rest = _after_block(body)
    else:
        end = _LENGTH + int.from_bytes(body[:_LENGTH], "big")
        rest = body[end:]
    return orjson.loads(body[_LENGTH:end]), rest
