"""The one wire vocabulary between the frontend, the template process and the workers.

- ``Kind``: the wire format of a request body (V2 JSON, gRPC protobuf, a custom endpoint).
- ``Op``: the opcode of a control-channel message.
- ``RequestHeader`` / ``ReplyHeader``: the fixed header written in front of a body in a
  ring slot, or in a control message (``Op.REQUEST`` / ``Op.REPLY``) when the body is too
  big for a slot. Both use the one packed layout ``HEADER``.
- ``Reply``: what the frontend writes out, built from a reply header or from an error.
- The control messages: typed structs (msgspec, MessagePack on the wire), one per
  opcode, and ``Dispatch``, the table that routes received messages to their handlers.
  Their base and opcodes are in ``ops.py``; a stream's flow control (its flags, windows
  and input messages) in ``stream_ops.py``; a runtime's calls to other models in
  ``call_ops.py``; a worker's custom-metrics report in
  ``metrics_report.py``. ``encode`` and ``decode`` here know them all.

Nothing here imports the rest of the engine: every process loads it cheaply.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple, TypeVar

import msgspec

from inferpool.engine.ipc.call_ops import Call, CallChannel, CallReply
from inferpool.engine.ipc.metrics_report import Metrics

# The opcodes and the message base live apart so that the stream and metrics messages can
# build on them; both are part of this vocabulary, re-exported here.
from inferpool.engine.ipc.ops import FD_OPS as FD_OPS
from inferpool.engine.ipc.ops import Control as Control
from inferpool.engine.ipc.ops import Op as Op
from inferpool.engine.ipc.ops import WithFds as WithFds
from inferpool.engine.ipc.shared_memory import DropRegions
from inferpool.engine.ipc.stream_ops import Credit, EndInput, Feed
from inferpool.errors import InferpoolError

logger = logging.getLogger(__name__)


class Kind(IntEnum):
    """The wire format of a request body."""

    REST = 0  # V2 JSON, optionally followed by Triton binary tensors (json_length set)
    GRPC = 1  # a serialized inference.ModelInferRequest
    CUSTOM = 2  # a runtime's custom endpoint or a feedback (framed by protocol/endpoints.py)
    # REST / GRPC with the request's headers in front, for a custom runtime's
    # parameters.headers (protocol/request_headers.py)
    REST_HEADERS = 3
    GRPC_HEADERS = 4
    GENERATE = 5  # the "generate" extension's JSON (text_input in, text_output out)
    # Streamed requests (engine/worker/streaming.py): a runtime with ``predict_stream``
    # answers them with several replies (``MORE`` set on all but the last); any other
    # runtime answers them with one. Every kind from REST_STREAM on streams.
    REST_STREAM = 6  # V2 JSON in, one V2 JSON response per chunk
    GRPC_STREAM = 7  # a ModelInferRequest in, one ModelInferResponse per chunk
    GENERATE_STREAM = 8  # GENERATE's JSON, one response per chunk
    # The first ModelInferRequest of a call whose later ones join the same stream
    # (``Feed``, then ``EndInput``): one ``predict_stream`` per client stream, as MLServer.
    GRPC_STREAM_IN = 9
    # REST / GRPC (or their _HEADERS kinds) with the table of registered shared-memory
    # regions in front (ipc/shared_memory.py): some of their tensors are in those regions.
    REST_SHM = 10
    GRPC_SHM = 11


# The kinds whose replies may come in several chunks.
STREAM_KINDS = frozenset(
    {Kind.REST_STREAM, Kind.GRPC_STREAM, Kind.GENERATE_STREAM, Kind.GRPC_STREAM_IN}
)


# -- the slot header -----------------------------------------------------------------------
# request id, model index, kind, flags (a reply's ``MORE``), status (a request's: its
# priority level, 0: none), json_length (-1: none),
# deadline (monotonic ns, 0: none), enqueued at (monotonic ns), then the four stage
# times (queue, compute_input, compute_infer, compute_output, in ns), then body length.
# A reply has no model index, kind, deadline or enqueued time: its deadline field carries
# the request's rows and its enqueued field the rows of the execution it ran in (see
# ``Reply.execution``), which the frontend's statistics count; its model index field the
# id of the batched execution it ran in (``Reply.execution_id``), which tracing links.
HEADER = struct.Struct("<QIBBHqqqqqqqQ")
HEADER_SIZE = HEADER.size

_Header = TypeVar("_Header", bound=tuple[Any, ...])

# A deadline further away than the header can hold (centuries) is no deadline at all.
_MAX_DEADLINE_NS = 2**63 - 1


def _tuple_new(cls: type[_Header], values: tuple[Any, ...]) -> _Header:
    """A header struct without its ``__new__``: a NamedTuple's own is Python code (about
    0.5 µs), and a header is built for every request and every reply."""
    return tuple.__new__(cls, values)


class RequestHeader(NamedTuple):
    """What a worker needs to know about a request, read from its packed header."""

    request_id: int
    model_index: int
    kind: int
    json_length: int | None
    deadline_ns: int  # monotonic; 0: none
    enqueued_ns: int  # when the frontend sent it (monotonic)
    length: int  # of the body

    @classmethod
    def of(cls, fields: tuple[int, ...]) -> RequestHeader:
        """From the unpacked ``HEADER`` fields (as a ring hands them out)."""
        json_length = fields[5]
        json = None if json_length < 0 else json_length
        return _tuple_new(cls, (fields[0], fields[1], fields[2], json, *fields[6:8], fields[12]))

    @classmethod
    def unpack_from(cls, buffer: bytes, offset: int = 0) -> RequestHeader:
        return cls.of(HEADER.unpack_from(buffer, offset))


class ReplyHeader(NamedTuple):
    """What the frontend needs to know about a reply, read from its packed header."""

    request_id: int
    status: int
    json_length: int | None
    times: StageTimes
    length: int  # of the body
    rows: int
    execution: int
    execution_id: int = 0  # of a batched execution (``Reply.execution_id``)
    flags: int = 0  # ``MORE``: a stream's chunk with more to come

    @classmethod
    def of(cls, fields: tuple[int, ...]) -> ReplyHeader:
        json_length = fields[5]
        times = StageTimes(fields[8], fields[9], fields[10], fields[11])
        json = None if json_length < 0 else json_length
        return _tuple_new(
            cls,
            (fields[0], fields[4], json, times, fields[12], *fields[6:8], fields[1], fields[3]),
        )

    @classmethod
    def unpack_from(cls, buffer: bytes, offset: int = 0) -> ReplyHeader:
        return cls.of(HEADER.unpack_from(buffer, offset))


def request_header(
    request_id: int,
    model_index: int,
    kind: int,
    json_length: int | None,
    deadline: float | None,
    length: int,
    priority: int = 0,
) -> bytes:
    """The packed header of a request leaving the frontend now; ``priority``: the level
    its header asked for (0: none; ``protocol/priority.py``), in the status field a request
    does not otherwise use.

    Raises ValueError (or OverflowError) for a value the header cannot carry, before
    anything is registered for the request, so that the caller answers 400.
    """
    if json_length is None:
        json_length = -1
    elif not 0 <= json_length <= length:
        raise ValueError(
            f"Inference-Header-Content-Length {json_length} is out of range: "
            f"the body has {length} bytes"
        )
    deadline_ns = 0
    if deadline is not None:
        if not 0 <= deadline < 1e300:  # NaN, infinities, negative
            raise ValueError(f"the request's deadline is out of range ({deadline})")
        deadline_ns = int(deadline * 1e9)
        if deadline_ns > _MAX_DEADLINE_NS:
            deadline_ns = 0
    return HEADER.pack(
        request_id, model_index, kind, 0, priority, json_length, deadline_ns,
        time.monotonic_ns(), 0, 0, 0, 0, length,
    )  # fmt: skip


def reply_header(request_id: int, reply: Reply) -> bytes:
    """The packed header of ``reply`` leaving a worker."""
    times = reply.times or _NO_TIMES
    json_length = -1 if reply.json_length is None else reply.json_length
    return HEADER.pack(
        request_id, reply.execution_id, 0, reply.flags, reply.status, json_length, reply.rows,
        reply.execution, times.queue, times.compute_input, times.compute_infer,
        times.compute_output, len(reply.body),
    )  # fmt: skip


# -- replies -------------------------------------------------------------------------------
@dataclass(slots=True)
class StageTimes:
    """Nanoseconds spent in each stage of one request (decode = compute_input, ...)."""

    queue: int = 0
    compute_input: int = 0
    compute_infer: int = 0
    compute_output: int = 0


_NO_TIMES = StageTimes()


@dataclass(slots=True)
class Reply:
    """What the frontend writes out: a 200 with the encoded response, or an error.

    For an error, ``body`` is the UTF-8 message; each frontend wraps it in its own format.
    ``json_length`` is the length of the JSON part of a REST reply that has binary tensors.
    ``rows`` is how many inferences (rows) the request held; ``execution`` the rows of the
    model execution (one predict) it ran in: positive in the one reply of that execution
    that counts it, negative in the others, 0 when the request did not run.
    ``execution_id`` names an execution that joined several requests (the same in each of
    their replies, unique in its worker for a while: it wraps at 2**32), 0 for a request
    predicted alone; tracing links the requests of one execution by it.
    ``flags``: ``MORE`` on a stream's chunk that is not its last reply.
    """

    status: int
    body: bytes
    json_length: int | None = None
    times: StageTimes | None = None
    rows: int = 0
    execution: int = 0
    execution_id: int = 0
    flags: int = 0

    @classmethod
    def from_error(cls, exc: BaseException, model: str = "") -> Reply:
        """The reply for an exception: its own status for an ``InferpoolError``, else a 500
        for a fault of the server (logged with its traceback, naming ``model``); a
        ``MemoryError`` under a worker's memory limit is the 500 that names it."""
        if isinstance(exc, MemoryError):
            exc = explain_memory_error(exc, model)
        if isinstance(exc, InferpoolError):
            return cls(exc.status, exc.message.encode())
        logger.error("unexpected error serving model %r", model, exc_info=exc)
        return cls(500, f"internal error: {type(exc).__name__}: {exc}".encode())

    @classmethod
    def from_header(cls, header: ReplyHeader, body: bytes) -> Reply:
        return cls(
            header.status, body, header.json_length, header.times, header.rows, header.execution,
            header.execution_id, header.flags,
        )  # fmt: skip

    @classmethod
    def from_fields(cls, fields: tuple[int, ...], body: bytes) -> Reply:
        """From the unpacked ``HEADER`` fields of a reply, as ``ReplyHeader.of`` reads them
        but without building the header first: the frontend completes every request here
        (``WorkerHandle.drain_replies``), and this halves the cost (0.56 µs against 1.1)."""
        json_length = fields[5]
        times = StageTimes(fields[8], fields[9], fields[10], fields[11])
        json = None if json_length < 0 else json_length
        return cls(fields[4], body, json, times, fields[6], fields[7], fields[1], fields[3])


# What a ``MemoryError`` becomes in this process: set by a worker under a memory limit
# (``engine/worker/memory_limit.py``), None elsewhere.
_out_of_memory: Callable[[MemoryError, str], Exception] | None = None


def set_out_of_memory(convert: Callable[[MemoryError, str], Exception] | None) -> None:
    """Have ``Reply.from_error`` turn a ``MemoryError`` into ``convert(exc, model)``."""
    global _out_of_memory
    _out_of_memory = convert


def explain_memory_error(exc: MemoryError, model: str) -> Exception:
    """What ``exc``, raised while serving ``model``, answers: the 500 naming the memory
    limit it hit in a worker under one, else ``exc`` itself."""
    return exc if _out_of_memory is None else _out_of_memory(exc, model)


# -- control messages ----------------------------------------------------------------------
class Hello(Control, frozen=True):
    op = Op.HELLO
    pid: int
    epoch: int = 0  # the template's epoch when it forked this worker (its copies then)


class Load(Control, frozen=True):
    op = Op.LOAD
    index: int
    settings: dict[str, Any]  # ModelSettings as JSON (``model_dump(mode="json")``)


class Loaded(Control, frozen=True):
    op = Op.LOADED
    index: int
    ok: bool
    error: str = ""
    metadata: dict[str, Any] = {}
    size: int = 0  # the model's footprint in bytes (``runtimes.footprint``)
    predictor: str | None = None


class Unload(Control, frozen=True):
    op = Op.UNLOAD
    index: int


class Stop(Control, frozen=True):
    op = Op.STOP


class Spawn(Control, frozen=True):
    op = Op.SPAWN
    worker: int
    threads: int
    slots: int
    slot_size: int
    limits: dict[str, int]  # protocol.limits.DecodeLimits as a dict
    memory_limit: int = 0  # bytes the worker may map beyond its start (worker/memory_limit.py)


class Preload(Control, frozen=True):
    """Models for the template to load (or keep) and share with the workers it forks."""

    op = Op.PRELOAD
    models: list[dict[str, Any]]  # ModelSettings as JSON
    token: int = 0  # echoed in the answer (``Preloaded``)


class PreloadResult(msgspec.Struct, frozen=True, array_like=True):
    """How the template's load of one model version went."""

    name: str
    version: str | None
    ok: bool
    error: str = ""
    size: int = 0  # the copy's footprint in bytes (``runtimes.footprint``)
    epoch: int = 0  # the template's epoch when this copy came in: workers forked since hold it
    # False: the template does not hold this model (its runtime is not fork-safe, or its
    # settings are unusable): each worker loads it.
    shareable: bool = True
    # Its load started a thread in the template, which exits after answering (it must
    # stay single-threaded to fork) and is never asked for this model again.
    forked_threads: bool = False


class Preloaded(Control, frozen=True):
    op = Op.PRELOADED
    token: int
    epoch: int  # the template's epoch after the change: it grows when its copies change
    models: list[PreloadResult]


class Unpreload(Control, frozen=True):
    op = Op.UNPRELOAD
    name: str
    version: str | None


class Ping(Control, frozen=True):
    op = Op.PING


class LogLevels(Control, frozen=True):
    """Loggers' new levels, by name (the root's under ""), as ``logging`` numbers them."""

    op = Op.LOG_LEVELS
    levels: dict[str, int]


class Pong(Control, frozen=True):
    op = Op.PONG


class Cancel(Control, frozen=True):
    op = Op.CANCEL
    request_id: int


class Recycle(Control, frozen=True):
    """A worker asks to be drained and replaced (``engine/pool/recycling.py``): ``reason`` is
    the metric's label (``memory_limit``), ``detail`` the sentence the log shows."""

    op = Op.RECYCLE
    reason: str
    detail: str


class Exited(Control, frozen=True):
    op = Op.EXITED
    pid: int
    status: int  # a waitpid status


class Log(Control, frozen=True):
    """A log record of a worker or the template (``inferpool.logs``)."""

    op = Op.LOG
    level: int
    logger: str
    message: str  # formatted with its arguments
    created: float  # time.time() when it was emitted
    exc: str = ""  # the traceback, as text
    requests: list[int] = []  # the ids of the requests being predicted (request headers')
    extra: dict[str, str | int | float | bool | None] = {}  # the record's ``extra=`` fields


class Loading(Control, frozen=True):
    """Sent before a model's load, and again before its runtime opens each artefact
    (``runtimes.load_errors.listen``): if the process dies before its answer, the frontend
    knows which model and which file killed it."""

    op = Op.LOADING
    name: str
    version: str | None
    file: str = ""  # the artefact being opened ("" before the runtime opens one)
    library: str = ""  # the library opening it, as load errors name it


_CONTROLS: tuple[type[Control], ...] = (
    Hello, Load, Loaded, Unload, Stop, Spawn, Preload, Ping, Pong, Cancel, Exited, Log,
    Metrics, Preloaded, Unpreload, Credit, Recycle, Loading, Feed, EndInput, LogLevels,
    DropRegions, Call, CallReply, CallChannel,
)  # fmt: skip
_ENCODER = msgspec.msgpack.Encoder()
_DECODERS: dict[int, msgspec.msgpack.Decoder[Any]] = {
    kind.op: msgspec.msgpack.Decoder(kind) for kind in _CONTROLS
}
# Ops whose payload is a packed header and a body rather than a struct.
BINARY_OPS = frozenset({Op.REQUEST, Op.REPLY})


class Parts(NamedTuple):
    """A spilled request's or reply's payload as read from its memfd: the packed header
    and the body apart, so that the body is not copied again to cut the header off."""

    header: bytes
    body: bytes


def header_and_body(payload: bytes | Parts) -> tuple[bytes, bytes]:
    """The packed header (``HEADER.unpack_from`` reads its start) and the body of a
    request's or reply's payload: inline (one bytes) or spilled (``Parts``)."""
    if isinstance(payload, Parts):
        return payload
    return payload, payload[HEADER_SIZE:]


def encode(message: Control) -> bytes:
    """The payload of a control message (its opcode travels apart)."""
    return _ENCODER.encode(message)


def decode(op: int, payload: bytes) -> Control:
    """The struct a control message carries; ValueError for an opcode or payload not ours."""
    decoder = _DECODERS.get(op)
    if decoder is None:
        raise ValueError(f"unknown control opcode {op}")
    try:
        message: Control = decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed {Op(op).name} message: {exc}") from None
    return message


Handler = Callable[..., object]  # a message; and its fds, for one of FD_OPS


class Dispatch:
    """Routes received control messages to handlers by opcode.

    A handler of ``Op.REQUEST`` / ``Op.REPLY`` gets the raw payload (header and body);
    any other gets the decoded struct, and one of ``FD_OPS`` the fds that came along too.
    A message with no handler is logged and dropped (its fds closed).
    """

    def __init__(self, handlers: Mapping[Op, Handler]) -> None:
        self._handlers = dict(handlers)

    def __call__(self, op: int, payload: bytes | Parts) -> None:
        handler = self._handlers.get(op)  # type: ignore[call-overload]
        if handler is None:
            logger.warning("dropping a control message nobody handles here (opcode %d)", op)
            if isinstance(payload, WithFds):
                for fd in payload.fds:
                    os.close(fd)
            return
        if op in BINARY_OPS:
            handler(payload)
        elif isinstance(payload, bytes):  # only a request or a reply comes as Parts
            handler(decode(op, payload))
        elif isinstance(payload, WithFds):
            handler(decode(op, payload.payload), payload.fds)
