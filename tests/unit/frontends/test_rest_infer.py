"""The infer routes in front of Starlette (rest/infer.py) and the one-write answer of the
HTTP/1.1 protocol (rest/http1.py ``respond``): same answers as through Starlette, one system
call per answer, and the ASGI messages whenever the protocol cannot write directly."""

from __future__ import annotations

import asyncio
import contextvars
import tracemalloc
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from uvicorn.server import ServerState

from inferpool.engine.inprocess import InProcessClient
from inferpool.errors import Overloaded
from inferpool.frontends.connections import Connections
from inferpool.frontends.rest.answer import failed, header_pairs
from inferpool.frontends.rest.app import build_app
from inferpool.frontends.rest.http1 import protocol_class
from inferpool.frontends.rest.infer import InferRoutes, infer_target
from inferpool.settings import ServerSettings
from tests.support import build_iris_repository
from tests.unit.frontends.test_request_context import loaded_client

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [1, 2, 3, 4]}]}


@pytest.mark.parametrize(
    ("path", "root", "target"),
    [
        ("/v2/models/iris/infer", "", ("iris", None)),
        ("/v2/models/iris/versions/3/infer", "", ("iris", "3")),
        ("/v2/models/stats/infer", "", ("stats", None)),
        ("/serve/v2/models/iris/infer", "/serve", ("iris", None)),
        ("/v2/models//infer", "", None),
        ("/v2/models/iris/versions//infer", "", None),
        ("/v2/models/iris/3/infer", "", None),
        ("/v2/models/a/b/c/d/infer", "", None),
        ("/v2/models/iris/infer/", "", None),
        ("/v2/models/iris/ready", "", None),
        ("/v2/models/infer", "", None),
    ],
)
def test_infer_paths_are_recognised_as_starlette_routes_them(path, root, target):
    assert infer_target(path, root) == target


def test_the_routes_in_front_answer_as_starlette_did(tmp_path):
    async def scenario() -> dict[str, httpx.Response]:
        client = await loaded_client(tmp_path)
        app = build_app(client)
        assert isinstance(app, InferRoutes)  # no middleware: nothing in front of it
        transport = httpx.ASGITransport(app=app)
        answers = {}
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            answers["ok"] = await http.post("/v2/models/iris-rf/infer", json={**BODY, "id": "a"})
            answers["versioned"] = await http.post("/v2/models/iris-rf/versions/9/infer", json=BODY)
            answers["bad"] = await http.post("/v2/models/iris-rf/infer", content=b"{")
            answers["get"] = await http.get("/v2/models/iris-rf/infer")
            answers["ready"] = await http.get("/v2/models/iris-rf/ready")
            answers["given"] = await http.post(
                "/v2/models/iris-rf/infer", json=BODY, headers={"x-request-id": "mine"}
            )
        await client.close()
        return answers

    answers = asyncio.run(scenario())
    ok = answers["ok"]
    assert ok.status_code == 200 and ok.headers["content-type"] == "application/json"
    assert ok.headers["x-request-id"] == "a" == ok.json()["id"]
    assert int(ok.headers["content-length"]) == len(ok.content)
    assert answers["versioned"].status_code == 404
    assert "error" in answers["versioned"].json()
    assert answers["versioned"].headers["x-request-id"]
    assert answers["bad"].status_code == 400 and "JSON" in answers["bad"].json()["error"]
    assert answers["get"].status_code == 405  # Starlette's answer, as before
    assert answers["ready"].status_code == 200
    assert answers["given"].headers["x-request-id"] == "mine"


def test_an_unexpected_error_is_a_json_500_without_a_traceback(tmp_path, caplog):
    async def scenario() -> httpx.Response:
        client = await loaded_client(tmp_path)
        app = build_app(client)
        assert isinstance(app, InferRoutes)

        async def broken(*args: Any) -> None:
            raise ZeroDivisionError("a bug")

        app.infer = broken  # type: ignore[assignment]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            answer = await http.post("/v2/models/iris-rf/infer", json=BODY)
        await client.close()
        return answer

    answer = asyncio.run(scenario())
    assert answer.status_code == 500
    assert answer.json() == {"error": "internal server error"}
    assert answer.headers["x-request-id"]
    assert "ZeroDivisionError" in caplog.text  # the log has the traceback


def test_an_overloaded_answer_says_when_to_retry():
    # In a context of its own: failed() sets the request id the way a request's task does.
    context = contextvars.copy_context()
    status, head, body = context.run(failed, {}, Overloaded("queue full"))
    pairs = dict(header_pairs(head))
    assert status == 503 and orjson.loads(body) == {"error": "queue full"}
    assert pairs[b"retry-after"] == b"1"
    assert pairs[b"content-length"] == str(len(body)).encode()


class _Transport(asyncio.Transport):
    """What the protocol writes, write by write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def write_eof(self) -> None:
        pass


async def _serve_one(app: Any, *parts: bytes, pause: bool = False) -> list[bytes]:
    """What the protocol writes for one request arriving in ``parts``; with ``pause`` the
    app runs between two parts (it reads what came before the next arrives)."""
    settings = ServerSettings()
    config = uvicorn.Config(app, lifespan="off", ws="none", log_config=None, access_log=False)
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", b"today"), (b"server", b"uvicorn")]
    protocol = protocol_class(settings, Connections(10))(config, state, {})
    transport = _Transport()
    protocol.connection_made(transport)
    for part in parts:
        protocol.data_received(part)
        if pause:
            await asyncio.sleep(0)
            await asyncio.sleep(0)
    for _ in range(100):
        await asyncio.sleep(0.01)
        if transport.writes and b"\r\n\r\n" in b"".join(transport.writes):
            break
    protocol.connection_lost(None)
    return transport.writes


def _request(path: str, body: bytes, close: bool = False) -> bytes:
    connection = b"connection: close\r\n" if close else b""
    return (
        b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n%s\r\n%s" % (path.encode(), len(body), connection, body)
    )


def test_an_answer_is_one_write_with_the_servers_headers(tmp_path):
    async def scenario() -> tuple[list[bytes], list[bytes]]:
        client = await loaded_client(tmp_path)
        app = build_app(client)
        keep = await _serve_one(app, _request("/v2/models/iris-rf/infer", orjson.dumps(BODY)))
        close = await _serve_one(
            app, _request("/v2/models/iris-rf/infer", orjson.dumps(BODY), close=True)
        )
        await client.close()
        return keep, close

    keep, close = asyncio.run(scenario())
    assert len(keep) == 1, keep
    head, _, body = keep[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK"
    assert b"date: today" in lines and b"server: uvicorn" in lines
    assert b"content-length: %d" % len(body) in lines
    assert orjson.loads(body)["model_name"] == "iris-rf"
    assert b"connection: close" not in lines
    assert len(close) == 1 and b"connection: close\r\n" in close[0]


def test_with_a_middleware_the_answer_goes_through_the_asgi_messages(tmp_path):
    """The access log must see the status: no direct write under a middleware."""

    async def scenario() -> list[bytes]:
        repository = build_iris_repository(tmp_path / "repo")
        settings = ServerSettings(model_repository=repository, workers=0, access_log=True)
        client = InProcessClient(settings)
        await client.start()
        app = build_app(client)
        assert not isinstance(app, InferRoutes)
        writes = await _serve_one(app, _request("/v2/models/iris-rf/infer", orjson.dumps(BODY)))
        await client.close()
        return writes

    writes = asyncio.run(scenario())
    assert len(writes) == 2  # status line and headers, then the body
    assert writes[0].startswith(b"HTTP/1.1 200 OK")


class _BodyRecorder:
    """An ASGI app that reads its request's body message by message, then answers 200."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            self.messages.append(message["body"])
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("pieces", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("pause", [False, True])
def test_a_body_in_any_number_of_chunks_arrives_whole_as_bytes(pieces, pause):
    body = bytes(range(256)) * 1000  # 256,000 bytes: past Uvicorn's 64 KiB high-water mark
    request = _request("/upload", body)
    step = -(-len(request) // pieces)
    parts = [request[i : i + step] for i in range(0, len(request), step)]
    app = _BodyRecorder()
    writes = asyncio.run(_serve_one(app, *parts, pause=pause))
    assert writes[0].startswith(b"HTTP/1.1 200 OK")
    assert b"".join(app.messages) == body
    assert all(type(message) is bytes for message in app.messages)
    if pause and pieces > 1:
        assert len(app.messages) > 1  # read as it came, not only once it was all there


def test_a_body_that_arrives_at_once_is_handed_over_without_a_copy():
    # Uvicorn's own on_body would copy it into a bytearray and out again: three copies of
    # the body alive at once (httptools' chunk, the bytearray, the bytes handed over).
    body = b"1.25," * 1_600_000  # 8 MB
    request = _request("/upload", body)
    app = _BodyRecorder()
    tracemalloc.start()
    try:
        writes = asyncio.run(_serve_one(app, request))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert writes[0].startswith(b"HTTP/1.1 200 OK")
    assert app.messages == [body]
    assert peak < 1.5 * len(body), peak
