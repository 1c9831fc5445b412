"""The builtin HTTP/2 connection fed directly, without sockets: Hypothesis frame sequences,
the connection registry hooks, flow-control and cache bounds (issue 12, points 3 and 7).

Any byte sequence after a valid preface must end in frames written (GOAWAY, RST_STREAM,
answers) or a close, never in an exception out of ``data_received``; and what the
connection holds (streams, buffered body bytes, the decoded-header cache, a partial
frame) must stay within its limits whatever arrives.
"""

from __future__ import annotations

import asyncio
import struct

import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferpool.transport import http2, http2_wire
from inferpool.transport.http2 import Http2Connection
from inferpool.transport.http2_headers import CACHE_BYTES, CACHE_ENTRIES
from inferpool.transport.http2_streams import VIEW_FRAME
from inferpool.transport.http2_wire import (
    CONNECTION_WINDOW,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PREFACE,
    RECEIVE_FRAME,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Limits,
    frame,
)

LIMITS = Limits(max_body=64 * 1024, max_header_count=20, max_streams=8)
REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closing = False
        self.aborted = False
        self.reading = True
        self.lines = 0  # writelines calls (an answer's large DATA frames as views)

    def write(self, data: bytes) -> None:
        assert not self.aborted, "written after abort"
        self.written += data

    def writelines(self, parts: list[bytes]) -> None:
        self.lines += 1
        for part in parts:
            self.write(part)

    def is_closing(self) -> bool:
        return self.closing or self.aborted

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        out, pos, data = [], 0, bytes(self.written)
        while len(data) - pos >= 9:
            length = int.from_bytes(data[pos : pos + 3], "big")
            kind, flags = data[pos + 3], data[pos + 4]
            stream_id = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            out.append((kind, flags, stream_id, data[pos + 9 : pos + 9 + length]))
            pos += 9 + length
        return out


class Registry:
    def __init__(self, admit: bool = True) -> None:
        self.admitting = admit
        self.open: set = set()

    def admit(self, connection) -> bool:
        if self.admitting:
            self.open.add(connection)
        return self.admitting

    def release(self, connection) -> None:
        self.open.discard(connection)


def run(scenario):
    """Run ``scenario`` (a plain function) inside a running loop, as asyncio would."""

    async def main():
        return scenario()

    return asyncio.run(main())


def connect(on_request=None, registry=None, limits: Limits = LIMITS):
    requests = []

    def record(connection, stream):
        requests.append(stream)
        if on_request is not None:
            on_request(connection, stream)

    connection = Http2Connection(record, limits=limits, registry=registry)
    transport = FakeTransport()
    connection.connection_made(transport)
    return connection, transport, requests


def handshake() -> bytes:
    return PREFACE + frame(SETTINGS, 0, 0)


def goaways(transport: FakeTransport) -> list[int]:
    return [
        struct.unpack(">I", p[4:8])[0] for kind, _, _, p in transport.frames() if kind == GOAWAY
    ]


def check_bounded(connection: Http2Connection) -> None:
    assert len(connection.streams) <= LIMITS.max_streams
    assert 0 <= connection._buffered <= connection._body_budget + CONNECTION_WINDOW
    assert len(connection._header_decoder.cache) <= CACHE_ENTRIES
    assert connection._header_decoder.cache_bytes <= CACHE_BYTES
    assert connection._partial_bytes <= RECEIVE_FRAME + 9 + len(PREFACE)
    assert connection._block_bytes <= 2 * LIMITS.max_header_bytes + RECEIVE_FRAME
    for stream in connection.streams.values():
        assert stream.received <= LIMITS.max_body
        assert stream.held == sum(map(len, stream.body))


# -- Hypothesis: random frames never raise, and state stays bounded ----------------------------
_ENCODER_BLOCKS = [hpack.Encoder().encode(REQUEST), b"\x82\x86\x84", b"\xff\xff\xff", b""]
stream_ids = st.sampled_from([0, 1, 2, 3, 5, 7, 9, 2**31 - 1])
payloads = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(_ENCODER_BLOCKS),
    st.builds(lambda n: b"\x00" + n.to_bytes(4, "big") + b"x" * 20, st.integers(0, 2**32 - 1)),
    st.builds(lambda k, v: struct.pack(">HI", k, v), st.integers(0, 8), st.integers(0, 2**32 - 1)),
    st.builds(lambda v: struct.pack(">I", v), st.integers(0, 2**32 - 1)),
)
frames = st.builds(
    lambda kind, flags, stream_id, payload: frame(kind, flags, stream_id, payload),
    st.integers(0, 10),
    st.sampled_from([0, END_STREAM, END_HEADERS, END_STREAM | END_HEADERS, 0x8, 0x20, 0xFF]),
    stream_ids,
    payloads,
)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    sequence=st.lists(frames, max_size=40),
    cuts=st.lists(st.integers(1, 200), max_size=10),
    answer=st.booleans(),
)
def test_random_frames_never_raise_and_state_stays_bounded(sequence, cuts, answer):
    def respond(connection, stream):
        if answer:
            connection.respond(stream, b"\x88", b"reply", b"\x00\x01a\x01b")

    def scenario():
        connection, transport, _ = connect(respond)
        data = handshake() + b"".join(sequence)
        pos = 0
        for cut in [*cuts, len(data)]:  # delivered in arbitrary pieces
            if transport.is_closing() or pos >= len(data):
                break
            connection.data_received(data[pos : pos + cut])
            pos += cut
            check_bounded(connection)
        connection.connection_lost(None)
        assert not connection.streams and connection._timer is None

    run(scenario)


@settings(max_examples=150, deadline=None)
@given(garbage=st.binary(min_size=1, max_size=300))
def test_random_bytes_after_the_preface_never_raise(garbage):
    def scenario():
        connection, _transport, _ = connect()
        connection.data_received(handshake() + garbage)
        check_bounded(connection)
        connection.connection_lost(None)

    run(scenario)


# -- bounds ------------------------------------------------------------------------------------
def test_the_decoded_header_cache_is_bounded_in_bytes():
    def scenario():
        connection, _transport, requests = connect(limits=Limits(max_streams=1000))
        data = [handshake()]
        encoder = hpack.Encoder()
        for i in range(300):  # distinct blocks, without indexing: the table never changes
            headers = [*REQUEST, (b"x-n", str(i).encode() * 300)]
            block = encoder.encode(headers, huffman=False)
            data.append(frame(HEADERS, END_HEADERS | END_STREAM, 2 * i + 1, block))
        connection.data_received(b"".join(data))
        assert len(requests) > 0
        assert connection._header_decoder.cache_bytes <= CACHE_BYTES
        assert len(connection._header_decoder.cache) <= CACHE_ENTRIES

    run(scenario)


def test_more_data_than_the_connection_window_is_a_flow_control_error():
    """Five streams of 1 MiB at once: within each stream's window, over the connection's."""

    def scenario():
        connection, transport, _ = connect(limits=Limits())
        block = hpack.Encoder().encode(REQUEST)
        data = [handshake()]
        chunk = b"\x00" * (256 * 1024 - 1)
        for i in range(5):
            data.append(frame(HEADERS, END_HEADERS, 2 * i + 1, block))
            data += [frame(DATA, 0, 2 * i + 1, chunk)] * 4
        connection.data_received(b"".join(data))
        assert goaways(transport) == [http2_wire.FLOW_CONTROL_ERROR]
        assert transport.closing

    run(scenario)


def test_a_body_is_no_longer_buffered_once_handed_over():
    def scenario():
        connection, _transport, requests = connect()
        block = hpack.Encoder().encode(REQUEST)
        connection.data_received(
            handshake()
            + frame(HEADERS, END_HEADERS, 1, block)
            + frame(DATA, 0, 1, b"\x00\x00\x00\x00\x10")
            + frame(DATA, END_STREAM, 1, b"y" * 16)
        )
        assert len(requests) == 1 and connection._buffered == 0
        assert b"".join(requests[0].body) == b"\x00\x00\x00\x00\x10" + b"y" * 16

    run(scenario)


@settings(max_examples=80, deadline=None)
@given(
    max_frame=st.sampled_from([16_384, 65_535, 65_536, 100_000, 262_144, 1 << 20]),
    window=st.integers(0, 1 << 20),
    updates=st.lists(st.integers(1, 1 << 19), max_size=12),
    lead=st.sampled_from([b"", b"\x00\x00\x04\xb0\x00"]),
)
def test_a_large_answer_goes_out_whole_in_the_frames_and_windows_the_peer_allows(
    max_frame, window, updates, lead
):
    """A 300 KiB answer, with or without a lead sent apart (a gRPC message's prefix): its
    DATA frames (heads with views of it, from VIEW_FRAME bytes) carry the lead then the
    body whole and in order, none over the peer's SETTINGS_MAX_FRAME_SIZE, none past its
    windows, and the trailers come last."""
    body = bytes(range(256)) * 1200

    def respond(connection, stream):
        connection.respond(stream, b"\x88", body, b"\x00\x01a\x01b", lead)

    def scenario():
        connection, transport, _ = connect(respond, limits=Limits())
        peer = struct.pack(">HI", 4, window) + struct.pack(">HI", 5, max_frame)
        block = hpack.Encoder().encode(REQUEST)
        request = frame(HEADERS, END_HEADERS | END_STREAM, 1, block)
        connection.data_received(PREFACE + frame(SETTINGS, 0, 0, peer) + request)
        given_connection, given_stream = 65_535, window
        for increment in [*updates, len(body), len(body)]:  # the last two let it all go
            sent = sum(len(p) for kind, _, _, p in transport.frames() if kind == DATA)
            assert sent <= min(given_connection, given_stream)
            window_update = struct.pack(">I", increment)
            connection.data_received(
                frame(WINDOW_UPDATE, 0, 0, window_update)
                + frame(WINDOW_UPDATE, 0, 1, window_update)
            )
            given_connection += increment
            given_stream += increment
        frames = [(kind, flags, p) for kind, flags, sid, p in transport.frames() if sid == 1]
        data = [p for kind, _, p in frames if kind == DATA]
        assert b"".join(data) == lead + body
        assert all(len(p) <= max_frame for p in data)
        assert frames[-1][0] == HEADERS and frames[-1][1] & END_STREAM
        assert (transport.lines > 0) == any(len(p) >= VIEW_FRAME for p in data)
        assert not goaways(transport)

    run(scenario)


# -- the connection registry -------------------------------------------------------------------
def test_a_connection_the_registry_refuses_is_closed_at_once():
    def scenario():
        registry = Registry(admit=False)
        connection, transport, _ = connect(registry=registry)
        assert transport.aborted and not transport.written
        connection.connection_lost(None)
        assert not registry.open

    run(scenario)


def test_idle_since_and_close_idle():
    def scenario():
        registry = Registry()
        connection, transport, _requests = connect(registry=registry)
        assert registry.open == {connection}
        assert connection.idle_since is not None  # nothing asked yet
        block = hpack.Encoder().encode(REQUEST)
        connection.data_received(handshake() + frame(HEADERS, END_HEADERS, 1, block))
        assert connection.idle_since is None  # a stream is open
        connection.data_received(frame(RST_STREAM, 0, 1, b"\x00\x00\x00\x08"))
        connection._tick()  # the timer's look: a stream was open since its last one
        assert connection.idle_since is not None
        connection.close_idle()
        assert goaways(transport) == [http2_wire.NO_ERROR] and transport.closing
        connection.connection_lost(None)
        assert not registry.open

    run(scenario)


@pytest.mark.parametrize("timeout", ["handshake", "idle"])
def test_the_timer_closes_a_silent_connection(timeout, monkeypatch):
    def scenario():
        connection, transport, _ = connect(limits=Limits(handshake_timeout=5, idle_timeout=5))
        if timeout == "idle":
            connection.data_received(handshake())
        clock = connection._now + 6
        monkeypatch.setattr(http2.time, "monotonic", lambda: clock)
        connection._tick()
        assert transport.closing
        assert goaways(transport) == ([http2_wire.NO_ERROR] if timeout == "idle" else [])

    run(scenario)
