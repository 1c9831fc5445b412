"""The wire vocabulary: headers, replies, control structs and their dispatch."""

from __future__ import annotations

import logging
import time

import pytest

from inferpool.engine.ipc import messages, metrics_report, stream_ops
from inferpool.engine.ipc.messages import Kind, Op, Reply, ReplyHeader, RequestHeader, StageTimes
from inferpool.errors import (
    BadRequest,
    ClientGone,
    DeadlineExceeded,
    ModelLoadError,
    RuntimeNotFound,
    TooLarge,
    WorkerLost,
    from_status,
)

SERIES = metrics_report.MetricSeries(["a"], 2.5, [1, 0, 1], 7)
HISTOGRAM = metrics_report.MetricFamily(
    "hits", "histogram", "Hits", ["kind"], [SERIES], "max", [0.5, 1]
)
# One example of every control struct, with a value in each field.
EXAMPLES: list[messages.Control] = [
    messages.Hello(pid=4242, epoch=5),
    messages.Call(
        call_id=3,
        model="iris",
        version=None,
        body=b'{"inputs": []}',
        caller="post",
        parents=[2**63, 5],
        timeout=1.5,
    ),
    messages.CallReply(call_id=3, status=404, body=b"model 'iris' not found"),
    messages.CallChannel(),
    messages.Load(index=7, settings={"name": "iris", "parameters": {"x": [1, 2]}}),
    messages.Loaded(index=7, ok=True, metadata={"name": "iris"}, size=1 << 40, predictor="tree"),
    messages.Loaded(index=8, ok=False, error="no model artefact"),
    messages.Unload(index=7),
    messages.Stop(),
    messages.Spawn(
        worker=1,
        threads=2,
        slots=64,
        slot_size=65536,
        limits={"max_json_depth": 64},
        memory_limit=2**30,
    ),
    messages.Preload(models=[{"name": "a"}, {"name": "b"}], token=9),
    messages.Ping(),
    messages.Pong(),
    messages.Cancel(request_id=2**63),
    messages.Exited(pid=99, status=9),
    metrics_report.Metrics(
        models=[metrics_report.ModelMetricsState(3, "iris", "2", [HISTOGRAM])],
        ended=[metrics_report.ModelMetricsState(2, "iris", "", [])],
    ),
    messages.Log(level=30, logger="m", message="odd", created=1.5, exc="T", requests=[7]),
    messages.Preloaded(
        token=3,
        epoch=2,
        models=[
            messages.PreloadResult("iris", None, True, size=2**40, epoch=2),
            messages.PreloadResult(
                "x", "1", False, "threads", shareable=False, forked_threads=True
            ),
        ],
    ),
    messages.Unpreload(name="iris", version="2"),
    stream_ops.Credit(request_id=2**63, chunks=8),
    messages.Recycle(reason="memory_limit", detail="model 'hog' hit the worker's memory limit"),
    messages.Loading(name="lgb", version=None, file="/m/lgb/model.txt", library="LightGBM"),
    stream_ops.Feed(request_id=7, body=b"\x0a\x01m" + bytes(range(256))),
    stream_ops.EndInput(request_id=7),
    messages.LogLevels(levels={"": 10, "talker": 40}),
    messages.DropRegions(serials=[3, 4]),
]


def test_kinds_and_opcodes_keep_their_wire_values() -> None:
    # Both sides of a pipe may come from different builds during an upgrade: these
    # numbers are the protocol, not an implementation detail.
    assert [int(kind) for kind in Kind] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert {op.name: int(op) for op in Op} == {
        "HELLO": 1, "LOAD": 2, "LOADED": 3, "UNLOAD": 4, "REQUEST": 5, "REPLY": 6, "STOP": 7,
        "SPAWN": 8, "PRELOAD": 9, "PING": 10, "PONG": 11, "CANCEL": 12, "EXITED": 13,
        "METRICS": 14, "LOG": 15, "PRELOADED": 16, "UNPRELOAD": 17, "CREDIT": 18,
        "RECYCLE": 40,
        "LOADING": 30,
        "FEED": 50, "END_INPUT": 51,
        "LOG_LEVELS": 60,
        "SHM_DROP": 70,
        "CALL": 80,
        "CALL_REPLY": 81,
        "CALL_CHANNEL": 82,
    }  # fmt: skip


def test_every_opcode_but_the_binary_ones_has_one_struct() -> None:
    typed = {type(example).op for example in EXAMPLES}
    assert typed | messages.BINARY_OPS == set(Op)
    assert not typed & messages.BINARY_OPS
    assert len({type(example) for example in EXAMPLES}) == len(typed)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_control_structs_round_trip(message: messages.Control) -> None:
    assert messages.decode(message.op, messages.encode(message)) == message


def test_a_payload_not_ours_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown control opcode 200"):
        messages.decode(200, b"")
    with pytest.raises(ValueError, match="malformed LOAD"):
        messages.decode(Op.LOAD, messages.encode(messages.Unload(index=1)))
    with pytest.raises(ValueError, match="malformed HELLO"):
        messages.decode(Op.HELLO, b"\xc1")  # never valid MessagePack


def test_request_header_round_trip() -> None:
    deadline = time.monotonic() + 3
    before = time.monotonic_ns()
    raw = messages.request_header(11, 3, Kind.GRPC, 5, deadline, 40)
    assert len(raw) == messages.HEADER_SIZE
    header = RequestHeader.unpack_from(b"xx" + raw, 2)
    assert header.request_id == 11 and header.model_index == 3 and header.kind == Kind.GRPC
    assert header.json_length == 5 and header.length == 40
    assert header.deadline_ns == int(deadline * 1e9)
    assert before <= header.enqueued_ns <= time.monotonic_ns()
    assert type(header) is RequestHeader and header._fields[0] == "request_id"
    plain = RequestHeader.unpack_from(messages.request_header(1, 1, Kind.REST, None, None, 0))
    assert plain.json_length is None and plain.deadline_ns == 0


def test_reply_header_carries_status_json_length_and_stage_times() -> None:
    reply = Reply(200, b"body!", 2, StageTimes(1, 2, 3, 4), rows=3, execution=-7)
    header = ReplyHeader.unpack_from(messages.reply_header(5, reply))
    assert header == ReplyHeader(5, 200, 2, StageTimes(1, 2, 3, 4), 5, 3, -7)
    assert Reply.from_header(header, b"body!") == reply
    # The frontend's per-reply shortcut reads the same fields the same way.
    fields = messages.HEADER.unpack(messages.reply_header(5, reply))
    assert Reply.from_fields(fields, b"body!") == reply
    assert type(ReplyHeader.of(fields)) is ReplyHeader
    bare = ReplyHeader.unpack_from(messages.reply_header(6, Reply(503, b"gone")))
    assert bare.json_length is None and bare.times == StageTimes() and bare.status == 503
    assert bare.flags == 0


def test_a_stream_chunk_carries_the_more_flag_both_ways() -> None:
    chunk = Reply(200, b"part", times=StageTimes(), flags=stream_ops.MORE)
    raw = messages.reply_header(9, chunk)
    assert ReplyHeader.unpack_from(raw).flags == stream_ops.MORE
    assert Reply.from_fields(messages.HEADER.unpack(raw), b"part") == chunk
    assert Reply.from_header(ReplyHeader.unpack_from(raw), b"part").flags == stream_ops.MORE


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (BadRequest("x"), 400),
        (TooLarge("x"), 413),
        (ClientGone("x"), 499),
        (WorkerLost("x"), 503),
        (DeadlineExceeded("x"), 504),
        (RuntimeNotFound("x"), 500),
    ],
)
def test_reply_from_an_error_of_the_tree_keeps_its_status(error, status) -> None:
    reply = Reply.from_error(error)
    assert reply.status == status and reply.body == b"x" and reply.times is None


def test_reply_from_an_unexpected_error_is_a_logged_500(caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="inferpool.engine.ipc.messages"):
        reply = Reply.from_error(KeyError("k"), model="iris")
    assert reply.status == 500 and reply.body == b"internal error: KeyError: 'k'"
    assert "'iris'" in caplog.text and "KeyError" in caplog.text


def test_the_error_tree_rebuilds_client_gone_and_runtime_errors() -> None:
    assert isinstance(from_status(499, "gone"), ClientGone)
    assert ClientGone("x").grpc_code == "CANCELLED"
    assert issubclass(RuntimeNotFound, ModelLoadError)


def test_dispatch_routes_by_opcode(caplog) -> None:
    seen: list[object] = []
    dispatch = messages.Dispatch({Op.LOAD: seen.append, Op.REPLY: seen.append})
    load = messages.Load(index=1, settings={})
    dispatch(Op.LOAD, messages.encode(load))
    dispatch(Op.REPLY, b"raw header and body")
    with caplog.at_level(logging.WARNING, logger="inferpool.engine.ipc.messages"):
        dispatch(Op.PING, messages.encode(messages.Ping()))
    assert seen == [load, b"raw header and body"]
    assert "opcode 10" in caplog.text
