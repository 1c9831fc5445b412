"""grpc.health.v1 without a server: the hand codec against grpcio-health-checking's
generated messages, and the Watch hub (``HealthService``) on a stand-in data plane."""

from __future__ import annotations

import asyncio

import pytest
from grpc_health.v1 import health_pb2

from inferpool.errors import ModelNotFound
from inferpool.frontends.grpc import health as health_module
from inferpool.frontends.grpc.health import HealthService, TooManyWatchers
from inferpool.protocol.health import (
    HealthCheckRequest,
    HealthCheckResponse,
    MalformedMessage,
    ServingStatus,
)

SERVING, NOT_SERVING = ServingStatus.SERVING, ServingStatus.NOT_SERVING


# -- the codec ---------------------------------------------------------------------------
@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService", "modèle-ü", "x" * 300])
def test_request_parses_what_the_generated_message_writes(service):
    data = health_pb2.HealthCheckRequest(service=service).SerializeToString()
    assert HealthCheckRequest.FromString(data).service == service


def test_request_skips_unknown_fields_and_keeps_the_last_service():
    first = health_pb2.HealthCheckRequest(service="first").SerializeToString()
    last = health_pb2.HealthCheckRequest(service="last").SerializeToString()
    # Unknown fields of every wire type: 2 (varint), 3 (fixed64), 4 (bytes), 5 (fixed32).
    unknown = b"\x10\x96\x01" + b"\x19" + bytes(8) + b"\x22\x03abc" + b"\x2d" + bytes(4)
    data = first + unknown + last
    assert health_pb2.HealthCheckRequest.FromString(data).service == "last"  # protobuf's view
    assert HealthCheckRequest.FromString(data).service == "last"


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a\x05abc",  # truncated string
        b"\x0a",  # no length
        b"\x08\xff",  # truncated varint
        b"\x0a\x02\xff\xfe",  # not UTF-8
        b"\x00\x01",  # field number 0
        b"\x0b",  # a group (wire type 3)
        b"\x0a" + b"\xff" * 11,  # overlong varint
    ],
)
def test_malformed_requests_are_refused(data):
    with pytest.raises(MalformedMessage):
        HealthCheckRequest.FromString(data)


@pytest.mark.parametrize("status", list(ServingStatus))
def test_response_bytes_are_the_generated_message_bytes(status):
    expected = health_pb2.HealthCheckResponse(status=int(status)).SerializeToString()
    assert HealthCheckResponse(status).SerializeToString() == expected
    assert health_pb2.HealthCheckResponse.FromString(expected).status == status


# -- the Watch hub -----------------------------------------------------------------------
class _Client:
    draining = False


class FakePlane:
    """What HealthService reads of a DataPlane: readiness and each model's."""

    def __init__(self) -> None:
        self.client = _Client()
        self.server_ready = True
        self.models = {"m": True}

    def ready(self) -> dict:
        return {"ready": self.server_ready and not self.client.draining}

    def model_ready(self, name: str, version: str | None) -> dict:
        if name not in self.models:
            raise ModelNotFound(f"model '{name}' not found")
        return {"name": name, "ready": self.models[name]}


class Inbox:
    """A Watch's send(): statuses received; ``busy`` refuses like an unread stream."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.busy = False

    def send(self, data: bytes) -> bool:
        if self.busy:
            return False
        self.statuses.append(health_pb2.HealthCheckResponse.FromString(data).status)
        return True


async def _rounds(n: int = 2) -> None:
    await asyncio.sleep(health_module.POLL_SECONDS * (n + 0.5))


def test_status_of_each_kind_of_service():
    plane = FakePlane()
    health = HealthService(plane)
    assert health.status("") is SERVING
    assert health.status("inference.GRPCInferenceService") is SERVING
    assert health.status("m") is SERVING
    assert health.status("other") is ServingStatus.SERVICE_UNKNOWN
    plane.models["m"] = False
    assert health.status("m") is NOT_SERVING
    assert health.status("") is SERVING
    plane.models["m"] = True
    plane.client.draining = True  # draining: every service is going away
    assert health.status("") is NOT_SERVING
    assert health.status("m") is NOT_SERVING


def test_check_refuses_an_unknown_service():
    health = HealthService(FakePlane())
    with pytest.raises(ModelNotFound, match="unknown service 'other'"):
        asyncio.run(health.check(HealthCheckRequest("other"), None))
    assert asyncio.run(health.check(HealthCheckRequest(""), None)).status is SERVING


def test_watch_sends_now_and_each_change_and_the_poller_runs_only_while_watched():
    async def scenario() -> None:
        plane = FakePlane()
        health = HealthService(plane)
        assert health._poller is None
        inbox, unknown = Inbox(), Inbox()
        watcher = health.watch("", inbox.send)
        other = health.watch("later", unknown.send)
        assert inbox.statuses == [SERVING]
        assert unknown.statuses == [ServingStatus.SERVICE_UNKNOWN]
        assert health._poller is not None
        await _rounds()
        assert inbox.statuses == [SERVING]  # no change, no message
        plane.server_ready = False
        plane.models["later"] = True  # a model of that name appears
        await _rounds()
        assert inbox.statuses == [SERVING, NOT_SERVING]
        assert unknown.statuses == [ServingStatus.SERVICE_UNKNOWN, SERVING]
        health.unwatch(watcher)
        poller = health._poller
        health.unwatch(other)
        assert health._poller is None and not health.watchers
        await asyncio.sleep(0)
        assert poller is not None and poller.cancelled()

    asyncio.run(scenario())


def test_a_watcher_that_cannot_take_a_message_gets_the_newest_once_it_can():
    async def scenario() -> None:
        plane = FakePlane()
        health = HealthService(plane)
        slow, other = Inbox(), Inbox()
        health.watch("", slow.send)
        health.watch("", other.send)
        slow.busy = True
        for ready in (False, True, False):
            plane.server_ready = ready
            await _rounds(1)
        assert other.statuses == [SERVING, NOT_SERVING, SERVING, NOT_SERVING]
        assert slow.statuses == [SERVING]  # nothing queued meanwhile
        slow.busy = False
        await _rounds(1)
        assert slow.statuses == [SERVING, NOT_SERVING]  # the newest, once

    asyncio.run(scenario())


def test_watches_are_bounded_and_close_ends_them(monkeypatch):
    monkeypatch.setattr(health_module, "MAX_WATCHERS", 3)

    async def scenario() -> None:
        plane = FakePlane()
        health = HealthService(plane)
        inboxes = [Inbox() for _ in range(3)]
        watchers = [health.watch("", inbox.send) for inbox in inboxes]
        with pytest.raises(TooManyWatchers, match="at most 3"):
            health.watch("", Inbox().send)
        health.unwatch(watchers.pop())
        watchers.append(health.watch("", inboxes[2].send))  # a place freed is usable
        plane.client.draining = True
        health.close()
        assert all(watcher.ended.done() for watcher in watchers)
        assert [inbox.statuses[-1] for inbox in inboxes] == [NOT_SERVING] * 3
        assert health._poller is None
        with pytest.raises(Exception, match="shutting down"):
            health.watch("", Inbox().send)

    asyncio.run(scenario())
