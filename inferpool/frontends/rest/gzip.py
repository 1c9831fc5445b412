"""Compressed REST answers (``gzip_enabled``, on by default as MLServer's): an answer body
of at least ``gzip_min_bytes`` goes out gzipped, at ``gzip_level``, to a client whose
``Accept-Encoding`` accepts gzip, with ``Content-Encoding: gzip``; every answer that size
says ``Vary: Accept-Encoding``, since its form depends on that header.

The infer routes (``infer.py``) compress their answer bytes here, in the frontend: a
smaller answer costs one length test, a larger one the header scan and the compressor
(``gzip_codec``: ISA-L's when installed, else zlib's; level 1 compresses V2 JSON nearly
as well as 6 or 9 at a fraction of the CPU: the figures are in benchmarks/RESULTS.md). An
answer of ``THREAD_BYTES`` or more is compressed in a thread (both let go of the GIL), so
the loop goes on serving other requests meanwhile. Triton's
binary extension is compressed whole: ``Inference-Header-Content-Length`` still counts the
JSON header's uncompressed bytes, as Triton sends it and tritonclient reads it.

Every other route (metadata, the repository API, custom endpoints, MLflow's scoring
routes) goes through Starlette's GZipMiddleware with the same threshold and level
(``GzipRoutes``); server-sent event streams are left as they are, since a compressor holds
events back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.middleware.gzip import GZipMiddleware

from inferpool.frontends.gzip_codec import gzipped
from inferpool.settings import ServerSettings

# Answers this large are compressed off the event loop.
THREAD_BYTES = 256 * 1024
VARY_LINE = b"vary: accept-encoding\r\n"
GZIP_LINES = b"content-encoding: gzip\r\n" + VARY_LINE
_LENGTH_LINE = b"content-length: %d\r\n"


def accepts_gzip(value: bytes) -> bool:
    """Whether an ``Accept-Encoding`` value accepts gzip: ``gzip`` (or ``x-gzip``), else
    ``*``, listed with a quality above 0 (RFC 9110, 12.5.3)."""
    named: float | None = None
    anything: float | None = None
    for item in value.lower().split(b","):
        coding, _, parameters = item.partition(b";")
        coding = coding.strip()
        if coding not in (b"gzip", b"x-gzip", b"*"):
            continue
        quality = _quality(parameters)
        if coding == b"*":
            anything = quality
        else:
            named = quality if named is None else max(named, quality)
    chosen = named if named is not None else anything
    return chosen is not None and chosen > 0


def _quality(parameters: bytes) -> float:
    """The ``q`` of a coding's parameters (1 when absent; 0 when unreadable)."""
    for parameter in parameters.split(b";"):
        name, _, value = parameter.partition(b"=")
        if name.strip() == b"q":
            try:
                return float(value.strip())
            except ValueError:
                return 0.0
    return 1.0


def accept_encoding(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Every ``Accept-Encoding`` value of an ASGI header list, joined (empty if none)."""
    values = [value for name, value in headers if name == b"accept-encoding"]
    return b",".join(values)


def _relength(head: bytes, old: int, new: int) -> bytes:
    """``head`` with its Content-Length line saying ``new`` instead of ``old`` (never
    touching ``inference-header-content-length``)."""
    line, replacement = _LENGTH_LINE % old, _LENGTH_LINE % new
    if head.startswith(line):
        return replacement + head[len(line) :]
    return head.replace(b"\n" + line, b"\n" + replacement, 1)


class AnswerGzip:
    """Compression of the infer routes' answers; call ``compress`` for a body of at least
    ``min_bytes`` (the route tests the length itself: the common small answer pays no
    call)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.min_bytes = settings.gzip_min_bytes
        self.level = settings.gzip_level

    async def compress(
        self, scope: Any, answer: tuple[int, bytes, bytes]
    ) -> tuple[int, bytes, bytes]:
        """``answer`` gzipped if the client accepts it; else with ``Vary`` only."""
        status, head, body = answer
        if not accepts_gzip(accept_encoding(scope["headers"])):
            return status, head + VARY_LINE, body
        if len(body) >= THREAD_BYTES:
            compressed = await asyncio.to_thread(gzipped, body, self.level)
        else:
            compressed = gzipped(body, self.level)
        head = _relength(head, len(body), len(compressed))
        return status, head + GZIP_LINES, compressed


def answer_gzip(settings: ServerSettings) -> AnswerGzip | None:
    """The infer routes' compressor, or None when ``gzip_enabled`` is off."""
    return AnswerGzip(settings) if settings.gzip_enabled else None


class GzipRoutes:
    """ASGI: Starlette's GZipMiddleware around ``app`` (the routes answered by
    Starlette), with the server's threshold and level; event streams pass untouched."""

    def __init__(self, app: Any, settings: ServerSettings) -> None:
        self.app = app
        self.gzip = GZipMiddleware(
            app, minimum_size=settings.gzip_min_bytes, compresslevel=settings.gzip_level
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not scope["path"].endswith("_stream"):
            await self.gzip(scope, receive, send)
        else:
            await self.app(scope, receive, send)
