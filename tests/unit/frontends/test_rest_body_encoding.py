"""A REST request body in a Content-Encoding (``frontends/rest/body.py``), read from an ASGI
``receive`` in chunks: gzip (several members too), deflate and identity decoded as they
arrive, the decompressed size bounded by the same limit, and every fault a clear error."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from typing import Any

import pytest

from inferpool.errors import BadRequest, ClientGone, TooLarge
from inferpool.frontends.rest.body import UnsupportedEncoding, read_body


def read(chunks: list[bytes], encoding: bytes | None, limit: int = 1 << 20, **kw: Any) -> bytes:
    """``read_body`` over ``chunks``, each an ASGI http.request message."""
    then: list[dict[str, Any]] = kw.get("then", [])
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": chunk, "more_body": bool(then) or i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    messages += then

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    return asyncio.run(read_body(receive, kw.get("content_length"), limit, encoding))


def split(data: bytes, size: int = 7) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


BODY = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}' * 20


@pytest.mark.parametrize("name", [b"gzip", b"x-gzip", b" GZIP "])
def test_gzip_arriving_in_chunks_is_the_body(name: bytes) -> None:
    assert read(split(gzip.compress(BODY)), name) == BODY


def test_deflate_is_zlibs_stream_and_identity_is_the_body_itself() -> None:
    assert read(split(zlib.compress(BODY)), b"deflate") == BODY
    assert read(split(BODY), b"identity") == BODY


def test_several_gzip_members_are_one_body_as_gzip_reads_them() -> None:
    data = gzip.compress(b"first,") + gzip.compress(b"second")
    assert read(split(data, 5), b"gzip") == b"first,second"


def test_an_encoding_it_lacks_is_a_415_naming_it() -> None:
    with pytest.raises(UnsupportedEncoding, match="'br' is not supported") as raised:
        read([b"x"], b"br")
    assert raised.value.status == 415


def test_a_body_that_inflates_past_the_limit_is_refused_before_it_is_held() -> None:
    bomb = gzip.compress(b"0" * 100_000)  # about 130 bytes on the wire
    with pytest.raises(TooLarge, match="decompressed request body exceeds the limit of 1000"):
        read(split(bomb), b"gzip", limit=1000)


@pytest.mark.parametrize(
    ("data", "encoding", "message"),
    [
        (b"not gzip at all", b"gzip", "not valid gzip data"),
        # mtime=0: the test's id holds these bytes, and each xdist process must collect
        # the same id (a gzip header's time differs between two seconds).
        (gzip.compress(BODY, mtime=0)[:-12], b"gzip", "ends inside its gzip stream"),
        (zlib.compress(b"a") + b"trailing", b"deflate", "data after the end of its deflate"),
    ],
)
def test_a_corrupt_or_truncated_stream_is_a_400(data: bytes, encoding: bytes, message) -> None:
    with pytest.raises(BadRequest, match=message):
        read(split(data), encoding)


def test_the_content_length_is_checked_before_anything_is_read() -> None:
    with pytest.raises(TooLarge, match="request body of 5000 bytes exceeds the limit of 10"):
        read([b"x"], b"gzip", limit=10, content_length=b"5000")


def test_a_client_gone_mid_body_is_client_gone() -> None:
    with pytest.raises(ClientGone):
        read([b"abc", b"def"], None, then=[{"type": "http.disconnect"}])
