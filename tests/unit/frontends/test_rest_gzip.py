"""rest_gzip: which Accept-Encoding values accept gzip, the Content-Length an infer answer
gets once compressed, and the Starlette routes behind GzipRoutes (compressed above the
threshold; event streams never)."""

from __future__ import annotations

import asyncio
import gzip

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from inferpool.frontends.rest.answer import BINARY_HEAD, JSON_HEAD
from inferpool.frontends.rest.gzip import THREAD_BYTES, AnswerGzip, GzipRoutes, accepts_gzip
from inferpool.settings import ServerSettings


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        (b"gzip", True),
        (b"GZIP", True),
        (b"x-gzip", True),
        (b"gzip, deflate, br", True),
        (b"br;q=1.0, gzip;q=0.5", True),
        (b"*", True),
        (b"identity;q=1, *;q=0.1", True),
        (b"gzip;q=0", False),
        (b"gzip; q=0.000", False),
        (b"*;q=0", False),
        (b"*, gzip;q=0", False),  # named wins over *
        (b"gzip;q=zero", False),
        (b"identity", False),
        (b"deflate, br", False),
        (b"", False),
        (b"gzipped", False),
    ],
)
def test_accepts_gzip(value, accepted):
    assert accepts_gzip(value) is accepted


def compress(answer, accept: bytes, min_bytes: int = 10):
    settings = ServerSettings(gzip_min_bytes=min_bytes, gzip_level=1)
    scope = {"headers": [(b"accept-encoding", accept)]}
    return asyncio.run(AnswerGzip(settings).compress(scope, answer))


def test_an_answer_gets_the_compressed_length_and_its_headers():
    body = b'{"outputs": [' + b"0.25, " * 1000 + b"1]}"
    head = JSON_HEAD % (len(body), b"id-1")
    status, zipped_head, zipped = compress((200, head, body), b"gzip")
    assert status == 200 and gzip.decompress(zipped) == body
    assert zipped_head == (
        b"content-type: application/json\r\ncontent-length: %d\r\nx-request-id: id-1\r\n"
        b"content-encoding: gzip\r\nvary: accept-encoding\r\n" % len(zipped)
    )
    # Not accepted: the same bytes, with Vary.
    assert compress((200, head, body), b"identity") == (
        200,
        head + b"vary: accept-encoding\r\n",
        body,
    )


def test_a_binary_answer_keeps_its_json_header_length():
    body = b'{"outputs": []}' + bytes(5000)
    head = BINARY_HEAD % (len(body), 15, b"id-2")
    _, zipped_head, zipped = compress((200, head, body), b"gzip")
    assert b"content-length: %d\r\n" % len(zipped) in zipped_head
    assert b"inference-header-content-length: 15\r\n" in zipped_head
    assert gzip.decompress(zipped) == body


def test_a_very_large_answer_is_compressed_off_the_loop():
    body = b"[" + b"1.5, " * (THREAD_BYTES // 4) + b"1]"
    _, head, zipped = compress((200, JSON_HEAD % (len(body), b"x"), body), b"gzip")
    assert gzip.decompress(zipped) == body
    assert b"content-length: %d\r\n" % len(zipped) in head


def get(min_bytes: int, path: str, accept: str) -> httpx.Response:
    async def big(request):
        return Response(b"a" * 5000, media_type="application/json")

    async def events(request):
        return Response(b"data: " + b"a" * 5000 + b"\n\n", media_type="text/event-stream")

    routes = [Route("/v2/models/m", big), Route("/v2/models/m/infer_stream", events)]
    app = GzipRoutes(Starlette(routes=routes), ServerSettings(gzip_min_bytes=min_bytes))

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get(path, headers={"Accept-Encoding": accept})

    return asyncio.run(run())


def test_starlette_routes_are_compressed_above_the_threshold():
    response = get(1024, "/v2/models/m", "gzip")
    assert response.headers["content-encoding"] == "gzip"
    assert response.content == b"a" * 5000
    assert "content-encoding" not in get(1024, "/v2/models/m", "identity").headers
    assert "content-encoding" not in get(10_000, "/v2/models/m", "gzip").headers
    assert "content-encoding" not in get(1024, "/v2/models/m/infer_stream", "gzip").headers


def test_settings_bounds():
    assert ServerSettings().gzip_enabled is True
    assert (ServerSettings().gzip_min_bytes, ServerSettings().gzip_level) == (1024, 1)
    for bad in ({"gzip_level": 0}, {"gzip_level": 10}, {"gzip_min_bytes": -1}):
        with pytest.raises(ValueError):
            ServerSettings(**bad)


@pytest.mark.parametrize(
    ("variable", "value", "enabled"),
    [
        ("MLSERVER_GZIP_ENABLED", "false", False),
        ("MLSERVER_GZIP_ENABLED", "true", True),
        ("INFERPOOL_GZIP_ENABLED", "false", False),
    ],
)
def test_mlserver_and_inferpool_variables_set_it(monkeypatch, variable, value, enabled):
    monkeypatch.setenv(variable, value)
    assert ServerSettings().gzip_enabled is enabled


@pytest.mark.parametrize("level", [1, 3, 6, 9])
def test_both_compressors_write_gzip(level):
    from inferpool.frontends import gzip_codec

    body = b'{"outputs": [' + b"0.123456789, 2, " * 500 + b"1]}"
    compressors = [gzip_codec._zlib]
    isal = gzip_codec._isal()
    if isal is not None:
        compressors.append(isal)
        assert gzip_codec.LIBRARY == "isal"  # installed: it is the one used
    for compress in compressors:
        compressed = compress(body, level)
        assert compressed[:2] == b"\x1f\x8b" and gzip.decompress(compressed) == body
        assert len(compressed) < len(body) // 4
