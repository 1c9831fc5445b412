"""REST streaming: ``infer_stream`` and ``generate_stream`` as Server-Sent Events, and
the ``generate`` extension's unary call.

``POST /v2/models/{name}[/versions/{v}]/infer_stream`` takes a V2 request and answers
``text/event-stream``: one ``data: <V2 response JSON>`` event per chunk of the model's
``predict_stream`` (one event in all for a model that does not stream).
``generate_stream`` does the same with the generate extension's flat JSON
(``{"text_input": ...}`` in, ``{"text_output": ..., "model_name": ...}`` out), and
``generate`` answers that JSON once. Like the infer route, this module never parses a
body: the worker decodes and encodes (``Kind.REST_STREAM``, ``Kind.GENERATE_STREAM``,
``Kind.GENERATE``).

A stream that fails before its first chunk is an ordinary error response (400, 404, 500,
503 with ``{"error": ...}``); one that fails later ends with a ``data: {"error": ...}``
event, as Triton's generate_stream does. A client that goes away cancels the stream: its
generator is closed in the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from inferpool.engine.client import EngineClient
from inferpool.engine.ipc.messages import Kind, Reply
from inferpool.engine.ipc.stream_ops import MORE
from inferpool.errors import BadRequest, InferpoolError
from inferpool.frontends.access_log import REQUEST_ID
from inferpool.frontends.request_context import HEADER_BYTES
from inferpool.frontends.rest.answer import answered, failed
from inferpool.frontends.rest.body import read_body, request_timeout, scan_headers
from inferpool.frontends.rest.ids import take_header_id
from inferpool.frontends.rest.stream_headers import with_headers

EVENT_STREAM = b"text/event-stream"


def stream_routes(
    client: EngineClient, answer: Callable[[tuple[int, bytes, bytes]], Response]
) -> list[BaseRoute]:
    """The routes of this module, under both model prefixes. ``answer``: turns an
    inference's ``(status, head, body)`` into a Starlette response (``app.py``'s)."""
    max_body = client.settings.max_body_bytes
    default_timeout = client.settings.request_timeout

    async def read(request: Request) -> tuple[bytes, float | None]:
        scope = request.scope
        content_length, binary, timeout_header, encoding, given, _ = scan_headers(scope["headers"])
        take_header_id(scope, given)
        if binary is not None:
            raise BadRequest("binary tensors (Inference-Header-Content-Length) cannot stream")
        timeout = request_timeout(timeout_header, default_timeout)
        body = await read_body(request.receive, content_length, max_body, encoding)
        return body, None if timeout is None else time.monotonic() + timeout

    def streamer(kind: Kind) -> Any:
        async def endpoint(request: Request) -> Response:
            scope = request.scope
            params = scope["path_params"]
            try:
                body, deadline = await read(request)
                replies = client.infer_stream(
                    params["name"], params.get("version"), kind, body, None, deadline
                )
                first = await anext(replies)
            except InferpoolError as exc:
                return answer(failed(scope, exc))
            if first.status != 200:  # nothing streamed yet: an ordinary error
                await replies.aclose()
                return answer(answered(scope, first))
            answered(scope, first)  # resolves the request id
            return EventStream(first, replies, scope[REQUEST_ID], params["name"])

        return endpoint

    async def generate(request: Request) -> Response:
        scope = request.scope
        params = scope["path_params"]
        try:
            body, deadline = await read(request)
            reply = await client.infer(
                params["name"], params.get("version"), Kind.GENERATE, body, None, deadline
            )
        except InferpoolError as exc:
            return answer(failed(scope, exc))
        return answer(answered(scope, reply))

    routes: list[BaseRoute] = []
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [
            Route(prefix + "/infer_stream", streamer(Kind.REST_STREAM), methods=["POST"]),
            Route(prefix + "/generate_stream", streamer(Kind.GENERATE_STREAM), methods=["POST"]),
            Route(prefix + "/generate", generate, methods=["POST"]),
        ]
    return routes


def event(reply: Reply, model: str, request_id: str) -> bytes:
    """One Server-Sent Event for a reply: its JSON (a V2 response with MLServer's
    ``parameters.headers``: ``stream_headers.py``), or ``{"error": ...}``."""
    if reply.status != 200:
        return b"data: " + orjson.dumps({"error": reply.body.decode("utf-8", "replace")}) + b"\n\n"
    body = reply.body
    if reply.json_length is not None:  # binary outputs cannot travel in an event
        message = "binary_data_output cannot stream: ask for JSON outputs"
        return b"data: " + orjson.dumps({"error": message}) + b"\n\n"
    return b"data: " + with_headers(body, model, request_id) + b"\n\n"


class EventStream(Response):
    """The events of a stream's replies, written as they come; stopped (the stream
    cancelled) when the client disconnects."""

    def __init__(
        self, first: Reply, replies: AsyncGenerator[Reply, None], request_id: str, model: str
    ) -> None:
        super().__init__(media_type=EVENT_STREAM.decode())
        self.first = first
        self.replies = replies
        self.request_id = request_id
        self.model = model

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"content-type", EVENT_STREAM),
            (b"cache-control", b"no-cache"),
            (HEADER_BYTES, self.request_id.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((pump, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not pump.done():
                pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await pump
            await self.replies.aclose()

    async def _pump(self, send: Send) -> None:
        reply = self.first
        while True:
            if reply.status != 200 or reply.body:
                body = event(reply, self.model, self.request_id)
                await send({"type": "http.response.body", "body": body, "more_body": True})
            if not reply.flags & MORE:
                break
            try:
                reply = await anext(self.replies)
            except StopAsyncIteration:
                break
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
