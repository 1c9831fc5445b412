"""Hypercorn over HTTP/2: a request's body is read to its end before its answer ends.

Hypercorn forgets a stream once its answer is complete, and a DATA frame that arrives for
a forgotten stream raises KeyError in ``H2Protocol._handle_events``: the whole connection
(every other call on it) is dropped, with a traceback at ERROR. That happens whenever the
app answers before the body has arrived: a 413 from Content-Length, a 400 from a header, a
404, or a route that reads no body. So, on HTTP/2 only, the final body message of an
answer waits until the request body has been received (and dropped), up to
``max_body_bytes`` + 16 MiB more; past that the stream ends anyway.
"""

from __future__ import annotations

from typing import Any

DRAIN_EXTRA = 16 * 1024 * 1024


class DrainBodyFirst:
    """ASGI middleware for Hypercorn: finish reading the request before the answer ends."""

    def __init__(self, app: Any, max_drain: int) -> None:
        self.app = app
        self.max_drain = max_drain + DRAIN_EXTRA

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("http_version") != "2":
            await self.app(scope, receive, send)
            return
        ended = False

        async def receive_noting_end() -> dict[str, Any]:
            nonlocal ended
            message: dict[str, Any] = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                ended = True
            return message

        async def send_after_body(message: dict[str, Any]) -> None:
            if (
                not ended
                and message["type"] == "http.response.body"
                and not message.get("more_body", False)
            ):
                drained = 0
                while not ended and drained <= self.max_drain:
                    drained += len((await receive_noting_end()).get("body", b""))
            await send(message)

        await self.app(scope, receive_noting_end, send_after_body)
