"""Hypercorn over HTTP/2 (``frontends/hypercorn_drain.py``): an answer's final body message
waits until the request body has been read to its end, bounded; HTTP/1.1 and other scopes
pass through untouched."""

from __future__ import annotations

import asyncio
from typing import Any

from inferpool.frontends.hypercorn_drain import DRAIN_EXTRA, DrainBodyFirst


async def early_404(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that answers before reading any of the body."""
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"nope"})


def run(app: Any, http_version: str, chunks: list[bytes], max_drain: int = 0) -> list[str]:
    """What happened, in order: "recv N" per body message read, "send TYPE" per message."""
    events: list[str] = []
    pending = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def receive() -> dict[str, Any]:
        message = pending.pop(0)
        events.append(f"recv {len(message['body'])}")
        return message

    async def send(message: dict[str, Any]) -> None:
        events.append(f"send {message['type']}")

    scope = {"type": "http", "http_version": http_version}
    asyncio.run(DrainBodyFirst(app, max_drain)(scope, receive, send))
    return events


def test_over_http2_the_body_is_read_before_the_answer_ends() -> None:
    events = run(early_404, "2", [b"a" * 10, b"b" * 20, b"c" * 5])
    assert events == [
        "send http.response.start",
        "recv 10",
        "recv 20",
        "recv 5",
        "send http.response.body",
    ]


def test_over_http1_the_answer_is_not_held() -> None:
    events = run(early_404, "1.1", [b"a" * 10, b"b" * 20])
    assert events == ["send http.response.start", "send http.response.body"]


def test_a_body_past_the_bound_is_left_unread() -> None:
    # max_drain 0: the bound is DRAIN_EXTRA; one chunk over it stops the draining.
    chunks = [b"x" * (DRAIN_EXTRA + 1), b"never read"]
    events = run(early_404, "2", chunks)
    assert events == [
        "send http.response.start",
        f"recv {DRAIN_EXTRA + 1}",
        "send http.response.body",
    ]


def test_an_app_that_read_the_body_answers_at_once() -> None:
    async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    events = run(echo, "2", [b"abc"])
    assert events == ["recv 3", "send http.response.start", "send http.response.body"]
