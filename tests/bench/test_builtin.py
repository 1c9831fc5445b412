"""The built-in generator's HTTP/1.1 client pieces."""

import asyncio

import pytest

from benchmarks.loadgen.builtin import http_request, read_response


def respond(raw: bytes) -> tuple[int, bytes]:
    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        return await read_response(reader)

    return asyncio.run(go())


def test_request_bytes():
    raw = http_request("h", 8, "/p", {"Content-Type": "application/json"}, b"{}")
    head, body = raw.split(b"\r\n\r\n")
    assert body == b"{}"
    assert head.split(b"\r\n") == [
        b"POST /p HTTP/1.1",
        b"Host: h:8",
        b"Content-Length: 2",
        b"Content-Type: application/json",
    ]


def test_content_length_response():
    raw = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx: y\r\n\r\nhello"
    assert respond(raw) == (200, b"hello")


def test_chunked_response():
    raw = (
        b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n"
    )
    assert respond(raw) == (503, b"abcde")


def test_response_without_length_is_an_error():
    with pytest.raises(ValueError):
        respond(b"HTTP/1.1 200 OK\r\n\r\nbody")
