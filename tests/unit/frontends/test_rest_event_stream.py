"""REST streaming's Server-Sent Events (``frontends/rest/stream.py``) without a server: the
event each reply becomes, and ``EventStream`` writing a stream's replies as ASGI messages,
skipping empty chunks, ending at the last reply, and closing the stream when the client
goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import orjson

from inferpool.engine.ipc.messages import Reply
from inferpool.engine.ipc.stream_ops import MORE
from inferpool.frontends.rest.stream import EventStream, event

RESPONSE = {
    "model_name": "m",
    "outputs": [{"name": "y", "shape": [1], "datatype": "INT64", "data": [3]}],
}


def data_of(chunk: bytes) -> Any:
    assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n"), chunk
    return orjson.loads(chunk[len(b"data: ") : -2])


def test_an_error_reply_is_an_error_event():
    assert data_of(event(Reply(503, "overloaded \xe9".encode()), "m", "r")) == {
        "error": "overloaded \xe9"
    }
    # A message that is not UTF-8 still makes a JSON event.
    assert data_of(event(Reply(500, b"bad \xff"), "m", "r")) == {"error": "bad \ufffd"}


def test_binary_outputs_cannot_stream():
    reply = Reply(200, b'{"outputs": []}\x00\x01', json_length=15)
    assert "binary_data_output cannot stream" in data_of(event(reply, "m", "r"))["error"]


def test_a_response_event_carries_its_headers_and_the_request_id():
    document = data_of(event(Reply(200, orjson.dumps(RESPONSE)), "m", "req-7"))
    assert document["outputs"] == RESPONSE["outputs"]
    headers = document["parameters"]["headers"]
    assert "req-7" in headers.values(), headers
    # Any other JSON (the generate extension's) goes out as it is.
    flat = orjson.dumps({"text_output": "hi", "model_name": "m"})
    assert event(Reply(200, flat), "m", "r") == b"data: " + flat + b"\n\n"


class Replies:
    """A stream's later replies, as ``EngineClient.infer_stream`` yields them; then waits
    forever if ``hang`` (a model still thinking), and records its closing."""

    def __init__(self, replies: list[Reply], hang: bool = False) -> None:
        self.replies = replies
        self.hang = hang
        self.closed = False

    async def generate(self) -> AsyncGenerator[Reply, None]:
        try:
            for reply in self.replies:
                yield reply
            if self.hang:
                await asyncio.Event().wait()
        finally:
            self.closed = True


def run_stream(first: Reply, later: Replies, client_leaves: bool = False) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    leave = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if len(sent) == 2 and client_leaves:
            leave.set()  # the client reads the first event, then disconnects

    async def receive() -> dict[str, Any]:
        if client_leaves:
            await leave.wait()
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # the client stays until the answer ends
        raise AssertionError("unreachable")

    async def run() -> None:
        generator = later.generate()
        stream = EventStream(first, generator, "rid-1", "m")
        await asyncio.wait_for(stream({"type": "http"}, receive, send), timeout=10)

    asyncio.run(run())
    return sent


def chunk(value: int, flags: int = MORE) -> Reply:
    body = dict(RESPONSE, outputs=[dict(RESPONSE["outputs"][0], data=[value])])
    return Reply(200, orjson.dumps(body), flags=flags)


def test_the_stream_writes_each_chunk_then_ends():
    later = Replies([Reply(200, b"", flags=MORE), chunk(2), Reply(500, b"model broke")])
    sent = run_stream(chunk(1), later)
    start, *bodies = sent
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"text/event-stream"
    assert headers[b"cache-control"] == b"no-cache"
    assert headers[b"x-request-id"] == b"rid-1"
    events = [message["body"] for message in bodies if message["body"]]
    assert [data_of(e).get("outputs", [{}])[0].get("data") for e in events[:2]] == [[1], [2]]
    assert data_of(events[2]) == {"error": "model broke"}  # the empty chunk wrote nothing
    assert len(events) == 3
    assert bodies[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert all(message["more_body"] for message in bodies[:-1])
    assert later.closed


def test_a_stream_whose_replies_run_out_ends_cleanly():
    later = Replies([])  # the generator ends though the first chunk said MORE
    sent = run_stream(chunk(1), later)
    assert [m["more_body"] for m in sent[1:]] == [True, False]
    assert later.closed


def test_a_single_reply_without_more_is_one_event():
    later = Replies([chunk(9)])
    sent = run_stream(chunk(1, flags=0), later)
    assert len(sent) == 3  # start, the one event, the end
    assert data_of(sent[1]["body"])["outputs"][0]["data"] == [1]


def test_a_client_that_leaves_closes_the_stream():
    later = Replies([], hang=True)
    sent = run_stream(chunk(1), later, client_leaves=True)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert later.closed  # the model's generator is closed, not left waiting
