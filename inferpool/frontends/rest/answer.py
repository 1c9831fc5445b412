"""The REST answer of an inference, as bytes: status, header block and body, written in
one piece.

An inference's answer is the engine's reply bytes (or the error of a request that failed
before one) with the resolved request id (``request_context``; set by ``settle_id``) in
``x-request-id``. It is built here as a status, a header block (``name: value\\r\\n``
lines, Content-Length included) and a body, from pre-built templates, so the infer routes
allocate no header list, dict or Response object per request.

``write`` sends it. Under inferpool's own HTTP/1.1 protocol (``http1.py``, Uvicorn's
httptools with guards) with no middleware around the route, the protocol writes status
line, headers and body with one ``transport.write`` (``DIRECT``): one system call per
answer, where ASGI's two messages cost two. Anything else (Hypercorn for HTTP/2, a
middleware that must see the messages, a peer not reading its answers) gets the same
bytes as the two ASGI messages.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import orjson
from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from inferpool.engine.ipc.messages import Reply
from inferpool.errors import InferpoolError, Overloaded
from inferpool.frontends.access_log import REPLY, REQUEST_ID
from inferpool.frontends.metrics_server import OVERLOAD, count_rejected
from inferpool.frontends.request_context import HEADER_BYTES, echoed_rest_id, generate
from inferpool.frontends.rest.body import BodyTooLarge
from inferpool.frontends.rest.ids import final_id, settle_id
from inferpool.transport.unsent import ANSWERS, SMALL

# Scope key of a server that writes a whole answer itself (http1.py): its protocol object,
# whose ``respond(scope, status, head, body)`` returns False when it cannot (then the ASGI
# messages go out instead).
DIRECT = "inferpool.direct"

_ID_LINE = HEADER_BYTES + b": %b\r\n"
JSON_HEAD = b"content-type: application/json\r\ncontent-length: %d\r\n" + _ID_LINE
BINARY_HEAD = (
    b"content-type: application/octet-stream\r\ncontent-length: %d\r\n"
    b"inference-header-content-length: %d\r\n" + _ID_LINE
)
RETRY_LINE = b"retry-after: 1\r\n"
# An HTTP header name (RFC 9110's token).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_OWN_HEADERS = frozenset({"content-type", "content-length", "transfer-encoding", "connection"})


def answered(scope: Any, reply: Reply) -> tuple[int, bytes, bytes]:
    """The reply, with the id resolved: the header's, else the one the response echoes
    (the V2 ``id``, or the worker's own), else a new one."""
    request_id = scope[REQUEST_ID]
    if request_id is None:
        echoed = reply.status == 200 and echoed_rest_id(reply.body)
        request_id = settle_id(scope, echoed or generate())
    body = reply.body
    # For the access log and the span, which read no 200's body: a large one stays only in
    # the transport, and is freed once sent, even if the connection keeps the scope.
    scope[REPLY] = reply if len(body) < SMALL else replace(reply, body=b"")
    identity = request_id.encode()
    if reply.status != 200:
        body = orjson.dumps({"error": body.decode("utf-8", "replace")})
        return reply.status, JSON_HEAD % (len(body), identity), body
    if reply.json_length is None:
        return 200, JSON_HEAD % (len(body), identity), body
    return 200, BINARY_HEAD % (len(body), reply.json_length, identity), body


def header_lines(headers: dict[str, str]) -> bytes:
    """A runtime's response headers as header lines (latin-1, as HTTP/1.1 carries them);
    a name that is not an HTTP token, or one the server sets itself (the body's type and
    framing), is left out rather than break the response."""
    lines = []
    for name, value in headers.items():
        if _TOKEN.fullmatch(name) and name.lower() not in _OWN_HEADERS:
            lines.append(f"{name}: {value}\r\n".encode("latin-1", "replace"))
    return b"".join(lines)


def failed(scope: Any, exc: InferpoolError) -> tuple[int, bytes, bytes]:
    """An inference that raised before a reply: the error, with its id."""
    status, head, body = _error(scope, exc.status, exc.message)
    return status, head + refusal_lines(exc), body


def _error(scope: Any, status: int, message: str) -> tuple[int, bytes, bytes]:
    request_id = final_id(scope)
    body = orjson.dumps({"error": message})
    return status, JSON_HEAD % (len(body), request_id.encode()), body


def held_back(scope: Any, answer: tuple[int, bytes, bytes]) -> tuple[int, bytes, bytes]:
    """``answer``, or a 503 with Retry-After in its place when keeping it for its client
    would pass a bound of the answers clients have not read yet (``transport/unsent.py``)."""
    size = len(answer[2])
    if size < SMALL:
        return answer
    refusal = ANSWERS.refusal(scope.get(DIRECT), size)
    if refusal is None:
        return answer
    limit, message = refusal
    count_rejected("rest", limit)
    status, head, body = _error(scope, 503, message)
    return status, head + RETRY_LINE, body


def refusal_lines(exc: InferpoolError) -> bytes:
    """Header lines an error adds (Retry-After when overloaded or the model is loading),
    counted in the metrics' refusals when a limit refused the request."""
    if exc.retry_after:
        if isinstance(exc, Overloaded):
            count_rejected("rest", OVERLOAD)
        return retry_line(exc.retry_seconds)
    if isinstance(exc, BodyTooLarge):
        count_rejected("rest", "max_body_bytes")
    return b""


def error_answer(
    defaults: list[tuple[bytes, bytes]], status: int, message: str, extra: bytes, close: bool
) -> bytes:
    """A whole HTTP/1.1 error answer written by the protocol itself (no app ran): status
    line, the server's ``defaults`` headers, ``extra`` lines, the JSON error; with
    ``Connection: close`` when ``close``."""
    body = orjson.dumps({"error": message})
    head = [STATUS_LINE[status]]
    for name, value in defaults:
        head += [name, b": ", value, b"\r\n"]
    head += [extra, b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)]
    head.append(b"connection: close\r\n\r\n" if close else b"\r\n")
    return b"".join(head) + body


def retry_line(seconds: int) -> bytes:
    """The Retry-After header line asking a client to come back in ``seconds``."""
    return RETRY_LINE if seconds == 1 else b"retry-after: %d\r\n" % seconds


def answer_response(answer: tuple[int, bytes, bytes]) -> Response:
    """An answer as a Starlette response, for the routes Starlette serves."""
    status, head, body = answer
    response = Response(body, status_code=status)
    response.raw_headers = header_pairs(head)
    return response


def header_pairs(head: bytes) -> list[tuple[bytes, bytes]]:
    """A header block as ASGI's ``(name, value)`` pairs."""
    pairs = []
    for line in head.split(b"\r\n"):
        if line:
            name, _, value = line.partition(b": ")
            pairs.append((name, value))
    return pairs


async def write(
    scope: Any, send: Any, answer: tuple[int, bytes, bytes], direct: bool = False
) -> None:
    """Send ``answer``; in one write by the protocol when ``direct`` and it can. A large
    answer past a bound of unsent answers is replaced by a 503 (``held_back``)."""
    status, head, body = held_back(scope, answer)
    if direct:
        writer = scope.get(DIRECT)
        if writer is not None and writer.respond(scope, status, head, body):
            return
    await send({"type": "http.response.start", "status": status, "headers": header_pairs(head)})
    await send({"type": "http.response.body", "body": body})
