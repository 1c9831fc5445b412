"""The streaming calls of the grpc.aio server (``frontends/grpc/aio.py``) without grpc's
server: health Watch as a generator over ``HealthService`` (a message per change, the end
at the server's stop, the client leaving, the refusal once the server stops),
ModelStreamInfer ending with the status of the error that cut it, and the peer's address
as the access log writes it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from inferpool.errors import BadRequest
from inferpool.frontends.grpc import health as health_module
from inferpool.frontends.grpc.aio import _call_of, health_watch, stream_infer
from inferpool.frontends.grpc.health import HealthService
from inferpool.protocol.health import ENCODED, HealthCheckRequest, ServingStatus


class Aborted(Exception):
    """What ``context.abort`` raises (grpc.aio's AbortError, here without grpc)."""


class Context:
    """The part of grpc.aio.ServicerContext the streaming calls use."""

    def __init__(self, peer: str = "ipv4:10.0.0.7:5123") -> None:
        self._peer = peer
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self) -> tuple:
        return (("x-user", "u"),)

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        return 30.0

    async def abort(self, code: grpc.StatusCode, text: str) -> None:
        self.aborted = (code, text)
        raise Aborted(text)


class Observer:
    """A CallObserver that logs: records each stream's end."""

    log = True
    tracer = None

    def __init__(self) -> None:
        self.ended: list[tuple[str, Any, str | None, str]] = []

    def stream_finished(
        self, method: str, metadata: Any, peer: str | None, code: str, started: float
    ) -> None:
        self.ended.append((method, tuple(metadata), peer, code))


class Plane:
    """The data plane's readiness, settable."""

    def __init__(self) -> None:
        self.is_ready = True
        self.client = SimpleNamespace(draining=False)

    def ready(self) -> dict[str, bool]:
        return {"ready": self.is_ready}


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch) -> None:
    monkeypatch.setattr(health_module, "POLL_SECONDS", 0.01)


def test_watch_yields_each_change_and_ends_ok_when_the_server_stops() -> None:
    plane, observer, context = Plane(), Observer(), Context()

    async def run() -> list[bytes]:
        health = HealthService(plane)  # type: ignore[arg-type]
        calls = health_watch(health, observer)(HealthCheckRequest(""), context)
        got = [await anext(calls)]
        plane.is_ready = False  # the drain begins
        got.append(await asyncio.wait_for(anext(calls), 5))
        health.close()
        got += [message async for message in calls]
        assert not health.watchers
        return got

    got = asyncio.run(run())
    assert got == [ENCODED[ServingStatus.SERVING], ENCODED[ServingStatus.NOT_SERVING]]
    assert observer.ended == [("Watch", (("x-user", "u"),), "10.0.0.7:5123", "OK")]


def test_a_watch_the_client_leaves_is_cancelled_and_let_go() -> None:
    plane, observer, context = Plane(), Observer(), Context()

    async def run() -> HealthService:
        health = HealthService(plane)  # type: ignore[arg-type]
        calls = health_watch(health, observer)(HealthCheckRequest(""), context)
        assert await anext(calls) == ENCODED[ServingStatus.SERVING]
        waiting = asyncio.ensure_future(anext(calls))
        await asyncio.sleep(0.05)  # it waits for a change that does not come
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await calls.aclose()
        return health

    health = asyncio.run(run())
    assert not health.watchers
    assert observer.ended[0][3] == "CANCELLED"


def test_a_watch_once_the_server_stops_is_unavailable() -> None:
    observer, context = Observer(), Context(peer="")

    async def run() -> None:
        health = HealthService(Plane())  # type: ignore[arg-type]
        health.close()
        calls = health_watch(health, observer)(HealthCheckRequest(""), context)
        with pytest.raises(Aborted):
            await anext(calls)

    asyncio.run(run())
    assert context.aborted == (grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
    assert observer.ended == [("Watch", (("x-user", "u"),), None, "UNAVAILABLE")]


class Service:
    """InferenceService.stream_infer: two answers, then the error that ends the call."""

    def __init__(self) -> None:
        self.deadline: float | None = None

    async def stream_infer(
        self, requests: AsyncIterator[bytes], deadline: float | None, metadata: Any
    ) -> AsyncIterator[bytes]:
        self.deadline = deadline
        async for request in requests:
            if request == b"bad":
                raise BadRequest("input 'x' has no data")
            yield b"answer to " + request


def test_stream_infer_answers_each_message_and_ends_with_the_errors_status() -> None:
    service, observer, context = Service(), Observer(), Context()

    async def requests() -> AsyncIterator[bytes]:
        for message in (b"one", b"two", b"bad", b"never"):
            yield message

    async def run() -> list[bytes]:
        got = []
        with pytest.raises(Aborted):
            async for answer in stream_infer(service, observer)(requests(), context):  # type: ignore[arg-type]
                got.append(answer)
        return got

    assert asyncio.run(run()) == [b"answer to one", b"answer to two"]
    assert context.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "input 'x' has no data")
    assert service.deadline is not None  # from the call's time remaining
    assert observer.ended == [
        ("ModelStreamInfer", (("x-user", "u"),), "10.0.0.7:5123", "INVALID_ARGUMENT")
    ]


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:127.0.0.1:5000", "127.0.0.1:5000"),
        ("ipv6:[::1]:5000", "[::1]:5000"),
        ("unix:/run/inferpool.sock", "unix:/run/inferpool.sock"),  # kept whole
        ("", None),
    ],
)
def test_the_peer_is_the_address_without_grpcs_scheme(peer: str, address: str | None) -> None:
    assert _call_of(Context(peer)) == (address, (("x-user", "u"),))  # type: ignore[arg-type]
