"""The request id: which id a request goes by, and where the server process finds it.

Resolution, the same for REST and gRPC (first that applies):

1. the ``x-request-id`` header (REST) or metadata (gRPC), as the client or a proxy in
   front (Envoy, Istio, nginx) set it;
2. the V2 ``id`` of the inference request;
3. an id the server generates.

The frontend never parses a JSON body (the worker does), so for REST the V2 ``id`` is read
from the reply instead: the worker echoes the request's ``id`` in the response, or a UUID
it generates when the request had none, always right after ``model_name``
(``echoed_rest_id``). gRPC reads ``id`` (field 3) in the same scan as the model name, and
takes the reply's field 3 when the request had none (``echoed_grpc_id``), so on both
protocols a successful response's ``id`` and its ``x-request-id`` are the same. A request
that fails before its reply, or whose reply is an error (which carries no ``id``), gets
``generate()``'s short id (``<8 random hex digits>-<counter in hex>``; the random prefix
is drawn per process).

The resolved id is echoed in the response header ``x-request-id`` (REST) and in the
trailing metadata ``x-request-id`` (gRPC, both implementations), for inference requests
(``/infer``, runtime endpoints, ModelInfer). A given id must be 1 to ``MAX_LENGTH``
printable ASCII characters, else the request is refused (400 / INVALID_ARGUMENT): it goes
into logs and back into a header unchanged.

The context itself (``current_request_id``, and the ids of the requests sent to workers
for their log records) is the leaf ``inferpool.request_ids``, which the engine and
``logs`` import without loading the frontends; this module is the frontends' part.
"""

from __future__ import annotations

import itertools
import os

import orjson

from inferpool.errors import BadRequest
from inferpool.protocol.protowire import read_varint

HEADER = "x-request-id"
HEADER_BYTES = b"x-request-id"
# Longest id taken from a client: generous for UUIDs, trace ids and proxies' ids.
MAX_LENGTH = 256

# -- generated ids ---------------------------------------------------------------------------
_prefix = ""
_counter = itertools.count(1)


def _new_prefix() -> None:
    global _prefix, _counter
    _prefix = os.urandom(4).hex() + "-"
    _counter = itertools.count(1)


_new_prefix()
# A forked process (a worker, a test's child) draws its own prefix: no id is issued twice.
os.register_at_fork(after_in_child=_new_prefix)


def generate() -> str:
    """A short id unique to this process's lifetime (and, by its random prefix, beyond)."""
    return f"{_prefix}{next(_counter):x}"


# -- ids given by the client -------------------------------------------------------------------
def checked(value: str) -> str:
    """A client's id, refused (400) unless 1 to MAX_LENGTH printable ASCII characters."""
    if 0 < len(value) <= MAX_LENGTH and value.isascii() and value.isprintable():
        return value
    raise BadRequest(
        f"x-request-id must be 1 to {MAX_LENGTH} printable ASCII characters "
        f"(got {len(value)} characters)"
    )


def from_header(value: bytes | None) -> str | None:
    """The request's ``x-request-id`` header value (``rest/body.scan_headers`` finds it in
    the pass that reads the others), checked; None when absent."""
    return None if value is None else checked(value.decode("latin-1"))


def from_metadata(metadata: object) -> str | None:
    """The ``x-request-id`` of grpc.aio's invocation metadata (``(key, value)`` pairs)."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == HEADER:
            return checked(value if isinstance(value, str) else value.decode("latin-1"))
    return None


# -- ids echoed in a reply ---------------------------------------------------------------------
# The one-byte keys of ModelInferResponse's first fields (length-delimited, wire type 2):
# model_name, model_version, id.
_NAME_KEY, _VERSION_KEY, _ID_KEY = 1 << 3 | 2, 2 << 3 | 2, 3 << 3 | 2
_BEFORE_ID = frozenset((_NAME_KEY, _VERSION_KEY, _ID_KEY))
_REST_START = b'{"model_name":"'
_REST_ID = b',"id":"'
# Bytes of a large body's start searched for its ``id`` (a longer id: a new one is made).
ID_WINDOW = 64 * 1024


def echoed_rest_id(body: bytes) -> str | None:
    """The ``id`` of a V2 REST response as the worker encodes it (``rest_json``:
    ``{"model_name":"...","id":"...",...}``), read from its first bytes; None for any
    other body (an error, a runtime endpoint's own answer). A large body may come as a
    view (``request_headers.unwrap``): its first ``ID_WINDOW`` bytes are read."""
    if not isinstance(body, bytes):
        body = bytes(body[:ID_WINDOW])
    if not body.startswith(_REST_START):
        return None
    start = len(_REST_START)
    end = body.find(b'"', start)
    if end > 0 and body[end - 1] == 0x5C:  # a backslash: the quote found is escaped
        end = _string_end(body, start)
    if end < 0 or not body.startswith(_REST_ID, end + 1):
        return None
    start = end + 1 + len(_REST_ID)
    end = body.find(b'"', start)
    if end < 0:
        return None
    if body.find(b"\\", start, end) >= 0:  # escapes: the quote found may be one of them
        end = _string_end(body, start)
        if end < 0:
            return None
        text: str = orjson.loads(body[start - 1 : end + 1])
        return text
    return body[start:end].decode()


def _string_end(body: bytes, start: int) -> int:
    """The index of the quote that closes the JSON string starting at ``start``; -1 if none."""
    end = body.find(b'"', start)
    while end > 0:
        backslashes = 0
        while body[end - 1 - backslashes] == 0x5C:  # "\\": the quote may be escaped
            backslashes += 1
        if not backslashes % 2:
            return end
        end = body.find(b'"', end + 1)
    return -1


def echoed_grpc_id(body: bytes) -> str | None:
    """The ``id`` (field 3) of a serialized ModelInferResponse (bytes, or a view of a large
    one). A serializer writes fields in number order, so only model_name (1) and
    model_version (2) come before it."""
    try:
        # The usual reply: a short name, maybe a short version, then a short id.
        if body[0] == _NAME_KEY and body[1] < 0x80:
            pos = 2 + body[1]
            if body[pos] == _VERSION_KEY and body[pos + 1] < 0x80:
                pos += 2 + body[pos + 1]
            if body[pos] == _ID_KEY and body[pos + 1] < 0x80:
                return str(body[pos + 2 : pos + 2 + body[pos + 1]], "utf-8") or None
        return _walk_to_id(body)
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def _walk_to_id(body: bytes) -> str | None:
    """``echoed_grpc_id`` for any lengths (varints of more than one byte) or no id."""
    pos, end = 0, len(body)
    while pos < end:
        key = body[pos]
        if key not in _BEFORE_ID:  # what comes after the id: there is none
            return None
        length, pos = read_varint(body, pos + 1)
        if key == _ID_KEY:
            return str(body[pos : pos + length], "utf-8") or None
        pos += length
    return None
