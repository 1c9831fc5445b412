"""The builtin HTTP/2 gRPC server on the wire: what real gRPC clients never send.

One in-process server (``--workers 0``, the default ``--grpc-implementation builtin``)
answers raw HTTP/2 from a plain socket: the ``h2`` library where it can produce the
frames, hand-made frames (``RawConnection``) where it cannot. Every connection checks,
for every frame the server sends, that it fits the client's SETTINGS_MAX_FRAME_SIZE and
the flow-control windows the client granted.

With ``--workers 0`` the model runs on the server's event loop: while the echo model
sleeps the server reads nothing, so a cancellation or a deadline can only be noticed
once the model returns.
"""

from __future__ import annotations

import itertools
import struct
import time
from urllib.parse import quote

import h2.config
import h2.connection
import h2.events
import h2.settings
import httpx
import numpy as np
import pytest
from h2.settings import SettingCodes

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server
from tests.support.grpc import build_grpc_repository
from tests.support.h2client import Client, RawConnection, assert_serving
from tests.support.h2frames import (
    ACK,
    CANCEL,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEADLINE_EXCEEDED,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INTERNAL,
    NOT_FOUND,
    OK,
    PADDED,
    PING,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    SERVICE,
    SETTINGS,
    TIMEOUT,
    UNIMPLEMENTED,
    WINDOW_UPDATE,
    echo_raw,
    echo_typed,
    frame,
    goaway,
    grpc_frame,
    raw_output,
    request_headers,
    typed_output,
    window_update,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = build_grpc_repository(tmp_path_factory.mktemp("grpc-http2"))
    with Server(repository, "--workers", "0") as server:
        server.wait_ready()
        yield server


# -- connection management ---------------------------------------------------------------
def test_settings_are_acknowledged_and_pings_answered_with_their_payload(server):
    with Client(server.grpc_port) as client:
        client.wait(lambda: client.count(h2.events.SettingsAcknowledged) == 1)

        client.h2.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: 7})  # a second one
        client.flush()
        client.wait(lambda: client.count(h2.events.SettingsAcknowledged) == 2)

        for payload in (b"\x00" * 8, b"pingpong", bytes(range(250, 256)) + b"\x01\x02"):
            client.h2.ping(payload)
            client.flush()
            client.wait(
                lambda p=payload: any(
                    isinstance(e, h2.events.PingAckReceived) and e.ping_data == p
                    for e in client.events
                )
            )
        acks = [f for f in client.frames_in if f.kind == PING]
        assert [(f.flags, f.stream_id) for f in acks] == [(ACK, 0)] * 3
        assert not any(f.kind == GOAWAY for f in client.frames_in)
        # ...and the connection still serves calls.
        assert typed_output(client.call(echo_typed(3)).response()) == [3]


# -- framing -----------------------------------------------------------------------------
def test_padded_prioritised_headers_and_a_body_over_padded_data_frames(server):
    payload = bytes(range(256)) * 40
    body = grpc_frame(echo_raw(payload))
    with RawConnection(server.grpc_port) as raw:
        block = raw.block(request_headers())
        pad = 13
        priority = struct.pack(">IB", 0x80000000 | 0, 200)  # exclusive, on stream 0, weight
        headers = bytes((pad,)) + priority + block + b"\x00" * pad
        flags = END_HEADERS | PADDED | PRIORITY_FLAG
        cuts = [0, 3, 1000, 5000, len(body)]  # the 5-byte prefix itself is split
        data = [body[a:b] for a, b in itertools.pairwise(cuts)]
        raw.send(
            frame(HEADERS, flags, 1, headers),
            frame(PRIORITY, 0, 1, struct.pack(">IB", 0, 15)),  # a PRIORITY frame: ignored
            frame(DATA, 0, 1, data[0]),
            frame(DATA, PADDED, 1, bytes((255,)) + data[1] + b"\x00" * 255),
            frame(DATA, PADDED, 1, bytes((4,)) + b"\x00" * 4),  # padding and no data at all
            frame(DATA, 0, 1, data[2]),
            frame(DATA, PADDED | END_STREAM, 1, bytes((0,)) + data[3]),  # zero-length padding
        )
        reply = raw.reply(1)
    assert raw_output(reply.response()) == payload


@pytest.mark.parametrize("fragment", [1, 7, 10_000], ids=lambda n: f"fragments-of-{n}")
def test_a_header_block_split_over_continuation_frames(server, fragment):
    with RawConnection(server.grpc_port) as raw:
        # Long custom metadata makes the block worth splitting into several CONTINUATIONs.
        block = raw.block(request_headers(extra=[(b"x-long", b"v" * 20_000)]))
        pieces = [block[i : i + fragment] for i in range(0, len(block), fragment)][:200]
        pieces[-1] += block[len(b"".join(pieces)) :]
        frames = [frame(HEADERS, 0, 1, pieces[0])]
        frames += [frame(CONTINUATION, 0, 1, piece) for piece in pieces[1:-1]]
        frames.append(frame(CONTINUATION, END_HEADERS, 1, pieces[-1]))
        assert len(frames) >= 2
        raw.send(*frames, frame(DATA, END_STREAM, 1, grpc_frame(echo_typed(17))))
        assert typed_output(raw.reply(1).response()) == [17]

        # HEADERS that carries END_STREAM before its CONTINUATION: a request with no body.
        block = raw.block(request_headers())
        raw.send(
            frame(HEADERS, END_STREAM, 3, block[:2]),
            frame(CONTINUATION, END_HEADERS, 3, block[2:]),
        )
        empty = raw.reply(3)
        assert empty.status == INTERNAL  # a unary call needs its one message


def test_interleaved_streams_each_get_their_own_answer(server):
    payloads = [f"stream {i} ".encode() * (1 + 300 * i) for i in range(10)]
    with Client(server.grpc_port) as client:
        stream_ids = []
        for _ in payloads:  # every HEADERS first...
            stream_ids.append(client.h2.get_next_available_stream_id())
            client.h2.send_headers(stream_ids[-1], request_headers())
        client.flush()
        bodies = [memoryview(grpc_frame(echo_raw(p))) for p in payloads]
        for offset in range(0, max(map(len, bodies)), 700):  # ...then DATA, round robin
            for stream_id, body in reversed(list(zip(stream_ids, bodies, strict=True))):
                if offset < len(body):
                    last = offset + 700 >= len(body)
                    client.h2.send_data(stream_id, body[offset : offset + 700], end_stream=last)
            client.flush()
        for stream_id, payload in zip(stream_ids, payloads, strict=True):
            assert raw_output(client.reply(stream_id).response()) == payload


# -- flow control ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("initial_window", "size", "limit"),
    [(100, 40_000, 100), (1 << 20, 200_000, DEFAULT_WINDOW)],
    ids=["stream-window", "connection-window"],
)
def test_a_response_larger_than_the_window_waits_for_window_updates(
    server, initial_window, size, limit
):
    payload = np.random.default_rng(0).bytes(size)
    with Client(server.grpc_port, auto_ack=False, initial_window_size=initial_window) as client:
        stream_id = client.start(echo_raw(payload))
        client.wait(lambda: client.replies[stream_id].data)
        client.quiet(0.3)  # everything the server may send without an update
        reply = client.replies[stream_id]
        assert 0 < len(reply.data) <= limit
        assert not reply.done, "the whole response came without a WINDOW_UPDATE"

        client.auto_ack = True  # acknowledge from now on: h2 sends the WINDOW_UPDATEs
        for event in client.events:
            if isinstance(event, h2.events.DataReceived):
                client.ack(event)
        client.flush()
        reply = client.reply(stream_id)
    assert raw_output(reply.response()) == payload  # FlowAudit checked every DATA frame


def test_a_request_body_larger_than_the_servers_receive_window(server):
    size = 18 * 1024 * 1024  # over the 16 MiB the server lets a peer send unacknowledged
    payload = np.random.default_rng(1).bytes(size)
    big = 1 << 24
    with Client(server.grpc_port, initial_window_size=big) as client:
        client.h2.increment_flow_control_window(big)
        client.flush()
        reply = client.call(echo_raw(payload), timeout=30)
        response = reply.response()
        updates = [f.stream_id for f in client.frames_in if f.kind == WINDOW_UPDATE]
    assert 1 in updates, "no WINDOW_UPDATE for the stream: the body could not have fit"
    assert updates.count(0) >= 2  # the one at connection start, then at least one more
    assert raw_output(response) == payload


def test_a_64_mib_message_streams_through_as_windows_are_given_back(server):
    """Receive windows are small (1 MiB a stream, 4 MiB the connection) and given back as
    the body arrives: a message just under the 64 MiB max_body_bytes still gets through."""
    payload = np.random.default_rng(3).bytes(64 * 1024 * 1024 - 1024)
    big = 1 << 24
    with Client(server.grpc_port, initial_window_size=big) as client:
        client.h2.increment_flow_control_window(big)
        client.flush()
        started = time.monotonic()
        reply = client.call(echo_raw(payload), timeout=60)
        elapsed = time.monotonic() - started
        response = reply.response()
        updates = [f.stream_id for f in client.frames_in if f.kind == WINDOW_UPDATE]
    assert raw_output(response) == payload
    assert updates.count(1) >= 60  # about one every 256 KiB
    assert elapsed < 30


# -- gRPC on top -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content_type",
    [b"text/plain", b"application/json", b"application/grpc-web+proto", None],
    ids=["text", "json", "grpc-web", "missing"],
)
def test_a_request_that_is_not_grpc_is_415(server, content_type):
    with Client(server.grpc_port) as client:
        reply = client.call(echo_typed(1), request_headers(content_type=content_type))
        assert dict(reply.headers)[b":status"] == b"415"
        assert reply.ended and not reply.data
        # application/grpc with a subtype is gRPC.
        headers = request_headers(content_type=b"application/grpc+proto")
        assert typed_output(client.call(echo_typed(2), headers).response()) == [2]


@pytest.mark.parametrize(
    ("headers", "body", "status", "words"),
    [
        (request_headers(SERVICE + b"NoSuchMethod"), None, UNIMPLEMENTED, "NoSuchMethod"),
        (request_headers(b"/other.Service/ModelInfer"), None, UNIMPLEMENTED, "other.Service"),
        (request_headers(), grpc_frame(echo_typed(1), compressed=1), INTERNAL, "compressed"),
        (request_headers(extra=[(b"grpc-timeout", b"soon")]), None, None, "grpc-timeout"),
        (request_headers(extra=[(b"grpc-timeout", b"1.5S")]), None, None, "grpc-timeout"),
        (request_headers(extra=[(b"grpc-timeout", b"123456789m")]), None, None, "grpc-timeout"),
        (request_headers(), b"", INTERNAL, "one request message"),
        (request_headers(), grpc_frame(b"") + grpc_frame(b""), INTERNAL, "one request message"),
    ],
    ids=[
        "unknown-method",
        "unknown-service",
        "compressed-message",
        "timeout-word",
        "timeout-fraction",
        "timeout-nine-digits",
        "no-message",
        "two-messages",
    ],
)
def test_a_bad_call_gets_a_grpc_status(server, headers, body, status, words):
    with Client(server.grpc_port) as client:
        reply = client.call(echo_typed(1), headers, raw_body=body)
        if status is None:
            assert reply.status != OK
        else:
            assert reply.status == status
        assert words in reply.message
        assert typed_output(client.call(echo_typed(9)).response()) == [9]  # still serving


def test_a_deadline_that_passes_while_the_model_runs_is_deadline_exceeded(server):
    with Client(server.grpc_port) as client:
        started = time.monotonic()
        headers = request_headers(extra=[(b"grpc-timeout", b"300m")])
        reply = client.call(echo_typed(1, sleep=1.0), headers)
        assert time.monotonic() - started < 5
        assert reply.status == DEADLINE_EXCEEDED, (reply.status, reply.message, reply.data)
        assert not reply.data
        # A deadline that does not pass changes nothing.
        headers = request_headers(extra=[(b"grpc-timeout", b"20S")])
        assert typed_output(client.call(echo_typed(8, sleep=0.05), headers).response()) == [8]


def test_a_stream_reset_while_the_model_runs_leaves_the_connection_usable(server, tmp_path):
    """With ``--workers 0`` the server reads the RST_STREAM only once the model has
    returned (and its reply is written): the reset meets a finished stream."""
    mark = tmp_path / "running"
    with Client(server.grpc_port) as client:
        stream_id = client.start(echo_typed(1, sleep=0.5, mark=mark))
        deadline = time.monotonic() + TIMEOUT
        while not mark.exists():
            assert time.monotonic() < deadline, "the model never started"
            time.sleep(0.01)
        client.h2.reset_stream(stream_id, CANCEL)
        client.flush()
        reply = client.call(echo_typed(6))
        assert typed_output(reply.response()) == [6]
        client.quiet(0.2)
        assert not client.eof
        assert not any(f.kind == GOAWAY for f in client.frames_in)


def test_a_stream_reset_during_its_upload_is_dropped(server):
    """Reset before END_STREAM: the call never runs, its late DATA is ignored."""
    body = grpc_frame(echo_raw(b"x" * 5000))
    with RawConnection(server.grpc_port) as raw:
        raw.send(
            frame(HEADERS, END_HEADERS, 1, raw.block(request_headers())),
            frame(DATA, 0, 1, body[:1000]),
            frame(RST_STREAM, 0, 1, struct.pack(">I", CANCEL)),
            frame(DATA, 0, 1, body[1000:2000]),  # in flight when the reset was sent
            frame(DATA, END_STREAM, 1, body[2000:]),
            frame(HEADERS, END_HEADERS, 3, raw.block(request_headers())),
            frame(DATA, END_STREAM, 3, grpc_frame(echo_typed(4))),
        )
        assert typed_output(raw.reply(3).response()) == [4]
        raw.quiet(0.3)
    assert not [f for f in raw.frames if f.stream_id == 1 and f.kind in (HEADERS, DATA)]
    assert not [f for f in raw.frames if f.kind == GOAWAY]


def test_non_ascii_not_found_message_matches_rest(server):
    name = "modèle-✓ 100% «ü»"
    with Client(server.grpc_port) as client:
        reply = client.call(pb.ModelInferRequest(model_name=name).SerializeToString())
    assert reply.status == NOT_FOUND
    encoded = reply.metadata()[b"grpc-message"]
    assert encoded.isascii() and b"%25" in encoded  # '%' itself is escaped
    rest = httpx.get(f"{server.url}/v2/models/{quote(name, safe='')}", timeout=TIMEOUT)
    assert rest.status_code == 404
    assert reply.message == rest.json()["error"]
    assert name in reply.message


def test_a_long_error_message_fits_the_clients_max_frame_size(server):
    """A model name (or a model's exception) can make grpc-message longer than the
    16 KiB a client accepts per frame: the trailers must be split (CONTINUATION)."""
    name = "m" * 20_000
    with Client(server.grpc_port) as client:
        reply = client.call(pb.ModelInferRequest(model_name=name).SerializeToString())
        assert reply.status == NOT_FOUND
        assert name in reply.message
        assert typed_output(client.call(echo_typed(5)).response()) == [5]


# -- not HTTP/2, or HTTP/2 gone wrong ----------------------------------------------------
@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /inference.GRPCInferenceService/ModelInfer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/grpc\r\nContent-Length: 0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
        b"PRI * HTTP/1.1\r\n",  # starts like the preface
        b"hi\r\n",
    ],
    ids=["http11-post", "h2c-upgrade", "preface-lookalike", "garbage"],
)
def test_a_client_that_does_not_speak_http2_is_disconnected(server, request_bytes):
    started = time.monotonic()
    with RawConnection(server.grpc_port, handshake=False) as raw:
        raw.send(request_bytes)
        frames = raw.read_until_closed(timeout=5)
    assert time.monotonic() - started < 3
    assert all(f.kind in (SETTINGS, WINDOW_UPDATE) for f in frames)  # no answer, no GOAWAY


def _headers_frame(raw: RawConnection, stream_id: int, flags: int = END_HEADERS) -> bytes:
    return frame(HEADERS, flags, stream_id, raw.block(request_headers()))


PROTOCOL_ERRORS = {
    "data-on-stream-0": (lambda raw: [frame(DATA, 0, 0, b"x")], PROTOCOL_ERROR),
    "headers-on-even-stream": (lambda raw: [_headers_frame(raw, 2)], PROTOCOL_ERROR),
    "data-on-idle-stream": (lambda raw: [frame(DATA, 0, 5, b"x")], PROTOCOL_ERROR),
    "continuation-without-headers": (
        lambda raw: [frame(CONTINUATION, END_HEADERS, 1, raw.block(request_headers()))],
        PROTOCOL_ERROR,
    ),
    "ping-between-headers-and-continuation": (
        lambda raw: [_headers_frame(raw, 1, flags=0), frame(PING, 0, 0, b"12345678")],
        PROTOCOL_ERROR,
    ),
    "ping-on-a-stream": (lambda raw: [frame(PING, 0, 1, b"12345678")], PROTOCOL_ERROR),
    "short-ping": (lambda raw: [frame(PING, 0, 0, b"1234567")], FRAME_SIZE_ERROR),
    "push-promise": (lambda raw: [frame(PUSH_PROMISE, END_HEADERS, 1, bytes(4))], PROTOCOL_ERROR),
    "settings-on-a-stream": (lambda raw: [frame(SETTINGS, 0, 1)], PROTOCOL_ERROR),
    "padding-longer-than-frame": (
        lambda raw: [_headers_frame(raw, 1), frame(DATA, PADDED, 1, b"\x05abc")],
        PROTOCOL_ERROR,
    ),
    "settings-length": (lambda raw: [frame(SETTINGS, 0, 0, b"\x00\x04\x00")], FRAME_SIZE_ERROR),
    "frame-over-max-size": (  # only the 9-byte head: the length alone is the error
        lambda raw: [struct.pack(">I", (1 << 20) + 1)[1:] + bytes((PRIORITY, 0)) + bytes(4)],
        FRAME_SIZE_ERROR,
    ),
    "connection-window-overflow": (lambda raw: [window_update(0, 2**31 - 1)], FLOW_CONTROL_ERROR),
    "bad-hpack": (
        lambda raw: [frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff")],
        COMPRESSION_ERROR,
    ),
}


@pytest.mark.parametrize("case", PROTOCOL_ERRORS)
def test_a_protocol_error_ends_the_connection_with_goaway(server, case):
    make_frames, code = PROTOCOL_ERRORS[case]
    with Client(server.grpc_port) as bystander, RawConnection(server.grpc_port) as raw:
        raw.send(*make_frames(raw))
        frames = raw.read_until_closed()
        _, received_code = goaway(frames)
        assert received_code == code
        assert frames[-1].kind == GOAWAY  # nothing after it
        # Other connections, open before or made after, are unaffected.
        assert typed_output(bystander.call(echo_typed(12)).response()) == [12]
    assert_serving(server)


def test_goaway_names_the_last_stream_it_processed(server):
    with RawConnection(server.grpc_port) as raw:
        raw.send(_headers_frame(raw, 1), frame(DATA, END_STREAM, 1, grpc_frame(echo_typed(1))))
        assert typed_output(raw.reply(1).response()) == [1]
        raw.send(frame(DATA, 0, 0, b"x"))
        assert goaway(raw.read_until_closed()) == (1, PROTOCOL_ERROR)
