"""Custom endpoints as both sides of the process boundary see them: the rules a path
follows, and the framing of a call (``Kind.CUSTOM``) and of its answer.

A call travels to the worker as a length-prefixed MessagePack head (``Call``: path, HTTP
method, query string, headers) followed by the raw body, so the body is never copied into
the head. The answer comes back in the reply's body the same way, the head's length in
the reply's ``json_length`` (which no other CUSTOM reply uses) and the handler's status as
the reply's status: a worker's error (unknown endpoint, a handler that raised) is a plain
reply with no head, as for inference. Nothing here is on the infer path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from inferpool.errors import BadRequest, InferpoolError

# The paths under /v2/models/{name}[/versions/{v}] that the protocol itself answers (and
# the streaming extension's): a runtime's endpoint may not take them.
RESERVED = frozenset(
    {"infer", "ready", "stats", "config", "versions", "feedback", "infer_stream", "generate",
     "generate_stream", "docs"}
)  # fmt: skip
# One path segment: RFC 3986's unreserved characters, no "." or ".." alone.
_SEGMENT = re.compile(r"[A-Za-z0-9_~-][A-Za-z0-9._~-]*")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# Internal calls that no URL reaches (their names hold a ":"): a feedback, as parsed JSON
# (REST) or a serialized inferpool.ModelFeedbackRequest (gRPC).
FEEDBACK_JSON = ":feedback/json"
FEEDBACK_GRPC = ":feedback/grpc"
# The path every model answers with its attributions (``engine/worker/explain.py``).
EXPLAIN = "explain"
_LENGTH = 4


class MethodNotAllowed(InferpoolError):
    """An endpoint asked with a method it does not answer; ``allow`` lists those it does."""

    status = 405

    def __init__(self, message: str, allow: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.allow = ", ".join(allow)


class Call(msgspec.Struct, array_like=True, frozen=True):
    """What a handler is told about the request, besides its body."""

    path: str
    method: str = "POST"
    query: str = ""
    headers: list[tuple[str, str]] = []


class Answer(msgspec.Struct, array_like=True, frozen=True):
    """What a handler set besides its status and body."""

    content_type: str = "application/json"
    headers: list[tuple[str, str]] = []
    reward: float | None = None  # a feedback's reward, counted by the frontend


_CALL = msgspec.msgpack.Decoder(Call)
_ANSWER = msgspec.msgpack.Decoder(Answer)
_ENCODER = msgspec.msgpack.Encoder()


def normalize(path: str) -> str:
    """A handler's path as registered: segments joined by "/", no leading or trailing "/";
    ValueError saying why for a path no URL can reach or the protocol owns."""
    if not isinstance(path, str):
        raise ValueError(f"a custom endpoint's path must be a string, not {path!r}")
    segments = path.strip("/").split("/")
    for segment in segments:
        if not _SEGMENT.fullmatch(segment):
            raise ValueError(
                f"custom endpoint path {path!r}: each segment must be letters, digits or "
                "'._~-' (not empty, not starting with '.')"
            )
    if segments[0] in RESERVED:
        raise ValueError(
            f"custom endpoint path {path!r}: '/{segments[0]}' is the protocol's own route"
        )
    return "/".join(segments)


def check_methods(methods: Iterable[str], path: str) -> tuple[str, ...]:
    """The methods of an endpoint, upper-cased; ValueError for one it cannot serve."""
    checked = tuple(dict.fromkeys(method.upper() for method in methods))
    unknown = [method for method in checked if method not in METHODS]
    if not checked or unknown:
        raise ValueError(
            f"custom endpoint {path!r}: methods must be among {', '.join(METHODS)}, got "
            f"{', '.join(unknown) or 'none'}"
        )
    return checked


def call_body(
    path: str,
    body: bytes,
    method: str = "POST",
    query: str = "",
    headers: list[tuple[str, str]] | None = None,
) -> bytes:
    """The body of a ``Kind.CUSTOM`` request."""
    head = _ENCODER.encode(Call(path, method, query, headers or []))
    return len(head).to_bytes(_LENGTH, "little") + head + body


def read_call(body: bytes) -> tuple[Call, bytes]:
    """The head and the raw body of a ``Kind.CUSTOM`` request."""
    length = int.from_bytes(body[:_LENGTH], "little")
    end = _LENGTH + length
    if len(body) < end:
        raise BadRequest("malformed custom endpoint call")
    try:
        return _CALL.decode(body[_LENGTH:end]), body[end:]
    except msgspec.DecodeError:
        raise BadRequest("malformed custom endpoint call") from None


def answer_head(answer: Answer) -> bytes:
    """The head a handler's answer goes out with, in front of its body."""
    return _ENCODER.encode(answer)


def read_answer(body: bytes, head_length: int | None) -> tuple[Answer, bytes] | None:
    """A CUSTOM reply's answer head and body, from the reply's body and ``json_length``;
    None for a plain error reply (its body the message)."""
    if head_length is None:
        return None
    return _ANSWER.decode(body[:head_length]), body[head_length:]


# The key under which a load's metadata carries the model's endpoints to the frontend
# (``announce``); the frontend takes it out before anything reads the metadata.
ANNOUNCED = "inferpool:endpoints"


class Announced(msgspec.Struct, frozen=True):
    """A loaded model's endpoints as the frontend routes them: methods by path, and
    whether its runtime serves them at their bare paths too; ``mlserver``: the runtime is
    an MLServer custom runtime (its gRPC stream answers in MLServer's message when the
    client speaks MLServer's: ``frontends/grpc/stream_message.py``); ``stream_input``: its
    ``predict_stream`` takes a gRPC call's whole stream (``Kind.GRPC_STREAM_IN``)."""

    paths: dict[str, list[str]] = {}
    bare: bool = False
    mlserver: bool = False
    stream_input: bool = False


def announce(metadata: dict[str, object], announced: Announced) -> dict[str, object]:
    """``metadata`` with the endpoints added, for the load's answer."""
    return {**metadata, ANNOUNCED: msgspec.to_builtins(announced)}


def take_announced(metadata: dict[str, object]) -> Announced:
    """The endpoints a load's metadata carries (removed from it); none if it carries none."""
    raw = metadata.pop(ANNOUNCED, None)
    return Announced() if raw is None else msgspec.convert(raw, Announced)
