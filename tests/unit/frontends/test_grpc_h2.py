"""gRPC over the builtin HTTP/2 layer (``frontends/grpc/h2.py``): its precomputed header
blocks, status trailers, grpc-timeout, message framing and the deadline of a call.

Header blocks are checked by decoding them with ``hpack.Decoder`` (an independent
implementation), not by comparing with bytes computed the same way.
"""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from urllib.parse import unquote

import pytest

from inferpool.frontends.grpc import h2 as grpc_h2
from inferpool.frontends.grpc import h2_call
from inferpool.frontends.grpc.h2_call import CallError, parse_timeout, status_trailers, unframe
from inferpool.transport.http2_streams import Stream
from tests.support.h2frames import hpack_decode


def test_the_response_header_blocks_decode():
    assert hpack_decode(h2_call.RESPONSE_HEADERS) == [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
    ]
    assert hpack_decode(h2_call.NOT_GRPC_HEADERS) == [(b":status", b"415")]
    assert hpack_decode(h2_call.OK_TRAILERS) == [(b"grpc-status", b"0")]


# -- status_trailers ---------------------------------------------------------------------
def test_status_trailers_carry_the_numeric_code():
    for name, number in h2_call.STATUS.items():
        assert hpack_decode(status_trailers(name)) == [(b"grpc-status", str(number).encode())]


@pytest.mark.parametrize(
    "message",
    [
        "model 'iris' not found",
        "100% done",  # '%' itself must be encoded
        "%41 is not A",  # and so a percent-escape lookalike survives the round trip
        "modèle «ünïcödé» 模型 not found 🙂",
        "line one\nline two\r\ttab\x00nul\x7fdel",
        " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~ printable punctuation stays",
        "long " + "é" * 200,  # longer than 127 bytes after encoding
    ],
)
def test_status_trailers_percent_encode_the_message(message):
    headers = hpack_decode(status_trailers("NOT_FOUND", message))
    assert headers[0] == (b"grpc-status", b"5")
    assert headers[1][0] == b"grpc-message"
    encoded = headers[1][1]
    assert all(0x20 <= byte <= 0x7E for byte in encoded), encoded  # visible ASCII only
    assert unquote(encoded.decode("ascii"), errors="strict") == message
    assert len(headers) == 2


def test_status_trailers_leave_printable_ascii_other_than_percent_alone():
    message = "model 'x' has no version '7' (see: /v2/models?ready=true) #1 & more"
    (_, (_, encoded)) = hpack_decode(status_trailers("NOT_FOUND", message))
    assert encoded == message.encode()
    (_, (_, encoded)) = hpack_decode(status_trailers("INTERNAL", "50% é"))
    assert encoded == b"50%25 %C3%A9"


def test_status_trailers_pushback_and_empty_message():
    assert hpack_decode(status_trailers("UNAVAILABLE", "overloaded", pushback=1000)) == [
        (b"grpc-status", b"14"),
        (b"grpc-message", b"overloaded"),
        (b"grpc-retry-pushback-ms", b"1000"),
    ]
    # A rate limit's pushback is the bucket's wait, in milliseconds.
    limited = hpack_decode(status_trailers("RESOURCE_EXHAUSTED", "slow down", pushback=3000))
    assert limited[-1] == (b"grpc-retry-pushback-ms", b"3000")
    assert hpack_decode(status_trailers("CANCELLED", "")) == [(b"grpc-status", b"1")]


# -- parse_timeout -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"2H", 7200.0),
        (b"3M", 180.0),
        (b"4S", 4.0),
        (b"250m", 0.25),
        (b"1500u", 0.0015),
        (b"7000000n", 0.007),
        (b"0S", 0.0),
        (b"9999999S", 9_999_999.0),  # under a year: as sent
        (b"99999999S", 365 * 24 * 3600.0),  # the most digits allowed (8): clamped to a year
        (b"2562047H", 365 * 24 * 3600.0),  # grpc-go's largest deadline (~292 years)
        (b"99999999H", 365 * 24 * 3600.0),
        (b"00000001m", 0.001),
    ],
)
def test_parse_timeout_in_every_unit(value, seconds):
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"S",  # no digits
        b"10",  # no unit
        b"10s",  # units are case-sensitive: 's' is not one
        b"10X",
        b"1.5S",
        b"-1S",
        b"+1S",
        b" 1S",
        b"1 S",
        b"123456789S",  # nine digits
        b"\xd9\xa1S",  # a non-ASCII digit
        b"1\xffS",
    ],
)
def test_parse_timeout_rejects_malformed_values(value):
    with pytest.raises(CallError) as caught:
        parse_timeout(value)
    assert caught.value.code in h2_call.STATUS and caught.value.code != "OK"
    assert "grpc-timeout" in caught.value.message


# -- unframe -----------------------------------------------------------------------------
def message_frame(body: bytes, compressed: int = 0) -> bytes:
    return bytes((compressed,)) + len(body).to_bytes(4, "big") + body


def test_unframe_returns_the_one_message():
    assert unframe([message_frame(b"hello")]) == b"hello"
    assert unframe([message_frame(b"")]) == b""
    assert h2_call.framed(b"hello") == message_frame(b"hello")


def test_unframe_joins_a_message_split_anywhere():
    whole = message_frame(bytes(range(256)) * 10)
    for cut in (1, 4, 5, 6, 100, len(whole) - 1):
        assert unframe([whole[:cut], whole[cut:]]) == bytes(range(256)) * 10
    assert unframe([bytes((b,)) for b in whole]) == bytes(range(256)) * 10
    assert unframe([b"", whole, b""]) == bytes(range(256)) * 10


def test_unframe_copies_a_large_chunked_message_once_behind_its_prefix():
    """From LARGE_MESSAGE on, the DATA chunks go into one buffer past the 5-byte prefix
    (not joined, then sliced); the result reads as the message, split anywhere."""
    message = bytes(range(256)) * (h2_call.LARGE_MESSAGE // 256 + 1)
    whole = message_frame(message)
    for cuts in ((1, 3, 4), (5,), (6, 70_000), (len(whole) - 1,)):
        bounds = [0, *cuts, len(whole)]
        chunks = [whole[a:b] for a, b in itertools.pairwise(bounds)]
        got = unframe([b"", *chunks])
        assert isinstance(got, bytearray) and got == message
    with pytest.raises(CallError, match="exactly one request message"):
        unframe([whole[:100], whole[100:] + b"x"])
    assert unframe([whole]) == message  # one chunk: a slice, as before


def test_unframe_inflates_a_message_by_its_grpc_encoding():
    import gzip
    import zlib

    message = b"hello " * 100
    assert unframe([message_frame(gzip.compress(message), 1)], encoding=b"gzip") == message
    assert unframe([message_frame(zlib.compress(message), 1)], encoding=b"deflate") == message
    # The flag decides: an identity message of a gzip call is read as it is.
    assert unframe([message_frame(message)], encoding=b"gzip") == message


@pytest.mark.parametrize(
    ("body", "encoding", "code"),
    [
        (b"gzipped?", None, "INTERNAL"),  # flagged compressed, no grpc-encoding
        (b"gzipped?", b"identity", "INTERNAL"),
        (b"gzipped?", b"br", "UNIMPLEMENTED"),
        (b"not gzip", b"gzip", "INTERNAL"),
        (b"\x1f\x8b\x08\x00", b"gzip", "INTERNAL"),  # truncated
        (None, b"gzip", "RESOURCE_EXHAUSTED"),  # inflates past the limit
    ],
)
def test_unframe_refuses_a_compressed_message_it_cannot_read(body, encoding, code):
    import gzip

    body = gzip.compress(b"x" * 1000) if body is None else body
    with pytest.raises(CallError) as caught:
        unframe([message_frame(body, compressed=1)], limit=500, encoding=encoding)
    assert caught.value.code == code


def test_unframe_refuses_an_unknown_flag():
    with pytest.raises(CallError) as caught:
        unframe([message_frame(b"x", compressed=2)])
    assert caught.value.code == "INTERNAL"


@pytest.mark.parametrize(
    "chunks",
    [
        [],  # HEADERS with END_STREAM: no body at all
        [b""],
        [b"\x00\x00\x00"],  # shorter than the 5-byte prefix
        [b"\x00\x00\x00\x00\x0ashort"],  # declares 10 bytes, carries 5
        [message_frame(b"one") + message_frame(b"two")],  # two messages
        [message_frame(b"one"), message_frame(b"two")],
        [message_frame(b"one") + b"\x00"],  # trailing garbage
    ],
)
def test_unframe_needs_exactly_one_message(chunks):
    with pytest.raises(CallError) as caught:
        unframe(chunks)
    assert caught.value.code == "INTERNAL"


def test_unframe_refuses_a_length_beyond_the_limit():
    with pytest.raises(CallError) as caught:
        unframe([b"\x00\xff\xff\xff\xff"])
    assert caught.value.code == "RESOURCE_EXHAUSTED"
    with pytest.raises(CallError) as caught:
        unframe([message_frame(b"x" * 101)], limit=100)
    assert caught.value.code == "RESOURCE_EXHAUSTED"
    assert "101 bytes" in caught.value.message and "max_body_bytes" in caught.value.message
    assert unframe([message_frame(b"x" * 100)], limit=100) == b"x" * 100


# -- deadlines -----------------------------------------------------------------------------
class FrozenClock:
    """``time`` for grpc_h2 whose monotonic clock never moves: the loop's timer still fires
    (it keeps its own time), as when it fires a hair before ``expires``."""

    def __init__(self) -> None:
        import time

        self.now = time.monotonic()
        self.perf_counter = time.perf_counter

    def monotonic(self) -> float:
        return self.now


class RecordingConnection:
    def __init__(self) -> None:
        self.replies: list[tuple[bytes, bytes, bytes]] = []

    def respond(self, stream, headers: bytes, body: bytes, trailers: bytes) -> None:
        self.replies.append((headers, body, trailers))


class NeverAnswers:
    async def infer(
        self, message: bytes, deadline: float | None, metadata=None, given=None, priority=None
    ):
        await asyncio.Event().wait()


def test_a_call_cut_by_its_deadline_timer_is_deadline_exceeded_even_if_the_clock_lags(
    monkeypatch,
):
    """The timer decides, not a second reading of the clock: uvloop's timers have a
    millisecond's grain and may fire just before time.monotonic() reaches the deadline.
    That call is DEADLINE_EXCEEDED, not "the server is shutting down"."""
    from inferpool.settings import ServerSettings

    clock = FrozenClock()
    monkeypatch.setattr(grpc_h2, "time", clock)
    # No engine: the service is replaced below; the data plane only binds ``infer``.
    no_engine = SimpleNamespace(infer=None)
    server = grpc_h2.GrpcH2Server(no_engine, ServerSettings(host="127.0.0.1", grpc_port=0))
    server.socket.close()
    server.service = NeverAnswers()
    connection, stream = RecordingConnection(), Stream(1, 65535)
    entry = ("ModelInfer", None, None)

    async def run() -> None:
        await asyncio.wait_for(
            server._call(connection, stream, entry, b"", clock.now + 0.05), timeout=5
        )

    asyncio.run(run())
    ((headers, body, trailers),) = connection.replies
    assert (body, trailers) == (b"", b"")  # Trailers-Only: the status is in the headers
    status = dict(hpack_decode(headers))
    assert status[b"grpc-status"] == b"4", status  # DEADLINE_EXCEEDED


# -- ModelStreamInfer's request messages, as their DATA arrives (h2_stream.py) -------------
async def _read_all(reader) -> list[bytes]:
    return [message async for message in reader]


def test_message_reader_cuts_messages_split_anywhere():
    from inferpool.frontends.grpc.h2_stream import MessageReader

    reader = MessageReader(limit=100)
    wire = h2_call.framed(b"one") + h2_call.framed(b"") + h2_call.framed(b"three")
    for i in range(len(wire)):
        reader.feed(wire[i : i + 1], False)
    reader.feed(b"", True)
    assert asyncio.run(_read_all(reader)) == [b"one", b"", b"three"]


def test_message_reader_inflates_messages_of_a_gzip_call():
    import gzip

    from inferpool.frontends.grpc.h2_stream import MessageReader

    reader = MessageReader(limit=100, encoding=b"gzip")
    wire = message_frame(gzip.compress(b"one"), 1) + h2_call.framed(b"two")
    reader.feed(wire, True)
    assert asyncio.run(_read_all(reader)) == [b"one", b"two"]
    # What waits unread is counted inflated: two messages of 60 bytes, 25 compressed.
    reader = MessageReader(limit=100, encoding=b"gzip")
    reader.feed(message_frame(gzip.compress(b"x" * 60), 1) * 2, True)
    with pytest.raises(CallError) as caught:
        asyncio.run(_read_all(reader))
    assert caught.value.code == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (b"\x01\x00\x00\x00\x01x", "INTERNAL"),  # flagged compressed, no grpc-encoding
        (b"\x02\x00\x00\x00\x01x", "INTERNAL"),  # no such flag
        (b"\x00\x00\x00\x01\x00", "RESOURCE_EXHAUSTED"),  # a message over the limit
        (h2_call.framed(b"x" * 60) * 2, "RESOURCE_EXHAUSTED"),  # too much waiting unread
        (b"\x00\x00\x00\x00\x05ab", "INTERNAL"),  # the stream ends inside a message
    ],
)
def test_message_reader_refuses_what_a_call_cannot_take(wire, code):
    from inferpool.frontends.grpc.h2_stream import MessageReader

    reader = MessageReader(limit=100)
    reader.feed(wire, True)
    with pytest.raises(CallError) as caught:
        asyncio.run(_read_all(reader))
    assert caught.value.code == code


def test_message_reader_refuses_a_compression_it_does_not_decode():
    from inferpool.frontends.grpc.h2_stream import MessageReader

    reader = MessageReader(limit=100, encoding=b"br")
    reader.feed(h2_call.framed(b"plain") + b"\x01\x00\x00\x00\x01x", True)
    with pytest.raises(CallError) as caught:
        asyncio.run(_read_all(reader))
    assert caught.value.code == "UNIMPLEMENTED"
    assert "'br'" in caught.value.message
