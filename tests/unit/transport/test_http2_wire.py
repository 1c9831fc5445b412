"""The HTTP/2 wire helpers: HPACK encoding of responses, and a connection that stops
reading a peer that does not read its answers.

HPACK output is checked by decoding it with ``hpack.Decoder`` (an independent
implementation), not by comparing with bytes computed the same way.
"""

from __future__ import annotations

import asyncio

import hpack
import pytest
from hpack.table import HeaderTable

from inferpool.transport import http2
from inferpool.transport.http2_wire import hpack_int, literal, literal_indexed_name
from tests.support.h2frames import hpack_decode


# -- hpack_int ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "prefix_bits", "encoded"),
    [
        (10, 5, b"\x0a"),  # RFC 7541 C.1.1
        (1337, 5, b"\x1f\x9a\x0a"),  # RFC 7541 C.1.2
        (42, 8, b"\x2a"),  # RFC 7541 C.1.3
        (30, 5, b"\x1e"),  # the largest value that fits the prefix
        (31, 5, b"\x1f\x00"),  # exactly the prefix limit: a zero continuation byte
        (126, 7, b"\x7e"),
        (127, 7, b"\x7f\x00"),
        (128, 7, b"\x7f\x01"),
        (127 + 128, 7, b"\x7f\x80\x01"),
        (0, 4, b"\x00"),
        (15, 4, b"\x0f\x00"),
    ],
)
def test_hpack_int_matches_rfc_7541(value, prefix_bits, encoded):
    assert hpack_int(value, prefix_bits) == encoded


@pytest.mark.parametrize("prefix_bits", [4, 5, 6, 7, 8])
@pytest.mark.parametrize(
    "value", [0, 1, 14, 15, 16, 62, 63, 64, 126, 127, 128, 255, 256, 2**14, 2**21 + 3, 2**31 - 1]
)
def test_hpack_int_round_trips_through_hpacks_decoder(value, prefix_bits):
    encoded = hpack_int(value, prefix_bits)
    assert hpack.hpack.decode_integer(encoded, prefix_bits) == (value, len(encoded))


def test_hpack_int_keeps_the_first_bytes_high_bits():
    assert hpack_int(5, 4, first=0x10) == b"\x15"
    assert hpack_int(20, 4, first=0x10) == b"\x1f\x05"  # 20 - 15 = 5
    assert hpack_int(3, 7, first=0x80) == b"\x83"


# -- literal / literal_indexed_name ------------------------------------------------------
@pytest.mark.parametrize("name_length", [1, 11, 126, 127, 128, 300])
@pytest.mark.parametrize("value_length", [0, 1, 126, 127, 128, 1000, 70_000])
def test_literal_decodes_to_its_name_and_value(name_length, value_length):
    name = (b"x-name-" * 60)[:name_length]
    value = bytes(32 + i % 95 for i in range(value_length))  # printable ASCII
    block = literal(name, value)
    assert block[0] == 0x00  # without indexing, new name
    assert hpack_decode(block) == [(name, value)]


def test_literals_concatenate_into_one_block():
    block = literal(b"grpc-status", b"0") + literal(b"grpc-message", b"m" * 200)
    assert hpack_decode(block) == [(b"grpc-status", b"0"), (b"grpc-message", b"m" * 200)]


@pytest.mark.parametrize("index", range(1, len(HeaderTable.STATIC_TABLE) + 1))
def test_literal_indexed_name_uses_the_static_tables_name(index):
    # Indexes 15 and up do not fit the 4-bit prefix: they need continuation bytes.
    value = b"v" * 130
    block = literal_indexed_name(index, value)
    assert block[0] & 0xF0 == 0x00  # without indexing, indexed name
    assert hpack_decode(block) == [(HeaderTable.STATIC_TABLE[index - 1][0], value)]


class _Transport:
    """Just enough of an asyncio transport to watch reading being paused."""

    def __init__(self) -> None:
        self.reading = True
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def test_a_peer_that_stops_reading_replies_stops_being_read():
    async def scenario() -> list[bool]:
        connection = http2.Http2Connection(lambda connection, stream: None)
        transport = _Transport()
        connection.connection_made(transport)
        states = [transport.reading]
        connection.pause_writing()  # asyncio: the write buffer passed its high-water mark
        states.append(transport.reading)
        connection.resume_writing()
        states.append(transport.reading)
        return states

    assert asyncio.run(scenario()) == [True, False, True]
