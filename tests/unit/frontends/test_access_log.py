"""The REST access log's middleware (``frontends/access_log.py``) around a plain ASGI app:
one line per request with its fields as the record's attributes, the client's request id
on a route that resolves none, a failing app logged as 500 and its error raised, and
scopes other than HTTP passed through unlogged."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from inferpool.frontends.access_log import RestObserver, given_id, model_in_path


async def answer(status: int, scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def call(app: Any, path: str, headers: list[tuple[bytes, bytes]], kind: str = "http") -> list:
    scope = {
        "type": kind,
        "method": "GET",
        "path": path,
        "headers": headers,
        "client": ("10.0.0.1", 5000),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(RestObserver(app, log=True)(scope, receive, send))
    return sent


def access_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "inferpool.access"]


def test_a_request_is_one_line_with_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "inferpool.access")

    async def app(scope, receive, send) -> None:
        await answer(404, scope, receive, send)

    sent = call(app, "/v2/models/iris/ready", [(b"x-request-id", b"abc-1")])
    assert sent[0]["status"] == 404  # the answer itself passes unchanged
    (record,) = access_records(caplog)
    fields = {k: getattr(record, k) for k in ("protocol", "method", "peer", "model", "status")}
    assert fields == {
        "protocol": "REST",
        "method": "GET /v2/models/iris/ready",
        "peer": "10.0.0.1:5000",
        "model": "iris",
        "status": 404,
    }
    assert record.request_id == "abc-1" and record.rows == 0  # type: ignore[attr-defined]
    assert "status=404" in record.getMessage()


def test_a_failing_app_is_logged_as_500_and_its_error_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "inferpool.access")

    async def app(scope, receive, send) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        call(app, "/v2/health/live", [])
    (record,) = access_records(caplog)
    assert record.status == 500 and record.model == "-"  # type: ignore[attr-defined]


def test_other_scopes_pass_through_unlogged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "inferpool.access")
    seen: list[str] = []

    async def app(scope, receive, send) -> None:
        seen.append(scope["type"])

    call(app, "/", [], kind="lifespan")
    assert seen == ["lifespan"] and access_records(caplog) == []


def test_the_clients_id_is_logged_only_when_usable() -> None:
    assert given_id([(b"x-request-id", b"ok-1")]) == "ok-1"
    assert given_id([("x-request-id", "ok-2")]) == "ok-2"  # a gRPC call's metadata
    assert given_id([(b"x-request-id", b"bad id\x01")]) is None
    assert given_id([(b"other", b"x")]) is None


def test_the_model_is_read_from_model_and_repository_paths() -> None:
    assert model_in_path("/v2/models/iris/versions/2/infer") == "iris"
    assert model_in_path("/v2/repository/models/iris/load") == "iris"
    assert model_in_path("/v2/models/stats") == "-"
    assert model_in_path("/metrics") == "-"
