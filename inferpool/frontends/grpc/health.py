"""``grpc.health.v1.Health`` (Check, Watch): the data plane's readiness for gRPC probes.

Kubernetes' gRPC probes and ``grpc_health_probe`` call Check; gRPC clients with
client-side health checking call Watch. The service name asked for decides the status:

- ``""`` and ``inference.GRPCInferenceService``: the server's readiness, exactly as
  ``/v2/health/ready`` and ServerReady (SERVING when ready; NOT_SERVING while starting,
  while a model that counts is not ready, and from the start of the drain on);
- a model's name: SERVING while that model is READY and the server is not draining, as
  ModelReady would say;
- anything else: Check answers NOT_FOUND, Watch SERVICE_UNKNOWN (and follows it: a model
  of that name loaded later turns it SERVING).

Watch sends the status at once, then a message whenever it changes. One task polls the
readiness every ``POLL_SECONDS`` while any Watch is open (none otherwise), computing each
service's status once per round for every watcher. A watcher is offered the latest
status only: one whose previous message has not gone out yet (a client that does not
read) is skipped until it has, so it holds one message at most and delays nobody. The
number of open Watches is bounded (``MAX_WATCHERS``); at shutdown every Watch gets the
final status, then ends with OK.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from inferpool.errors import InferpoolError, ModelNotFound, NotReady
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.grpc.service import SERVICE
from inferpool.protocol.health import (
    ENCODED,
    HealthCheckRequest,
    HealthCheckResponse,
    ServingStatus,
)

logger = logging.getLogger(__name__)

HEALTH_SERVICE = "grpc.health.v1.Health"
CHECK_PATH = f"/{HEALTH_SERVICE}/Check".encode()
WATCH_PATH = f"/{HEALTH_SERVICE}/Watch".encode()
# How soon a Watch sees a change; flips shorter than this may not be seen.
POLL_SECONDS = 0.1
# Open Watches, over both gRPC servers' connections; more are RESOURCE_EXHAUSTED.
MAX_WATCHERS = 1000

# Takes one encoded HealthCheckResponse; False when it cannot now (the one before has not
# gone out yet): the watcher is offered the status again on the next round.
Send = Callable[[bytes], bool]


class TooManyWatchers(InferpoolError):
    """More health Watch streams open than the server keeps."""

    status = 429  # RESOURCE_EXHAUSTED


class Watcher:
    """One open Watch: its service, how to send to it, what it was sent last."""

    __slots__ = ("ended", "send", "sent", "service")

    def __init__(self, service: str, send: Send) -> None:
        self.service = service
        self.send = send
        self.sent: ServingStatus | None = None
        # Resolved when the server stops: the call then ends with OK.
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def offer(self, status: ServingStatus) -> None:
        if status is not self.sent and self.send(ENCODED[status]):
            self.sent = status


class HealthService:
    """Check, and the open Watches of one gRPC server, over one data plane."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.watchers: set[Watcher] = set()
        self._poller: asyncio.Task[None] | None = None
        self._closed = False

    def status(self, service: str) -> ServingStatus:
        """The serving status of ``service`` now (SERVICE_UNKNOWN: not a service here)."""
        if service in ("", SERVICE):
            ready = self.plane.ready()["ready"]
        else:
            try:
                ready = self.plane.model_ready(service, None)["ready"]
            except ModelNotFound:
                return ServingStatus.SERVICE_UNKNOWN
            ready = ready and not self.plane.client.draining
        return ServingStatus.SERVING if ready else ServingStatus.NOT_SERVING

    async def check(self, request: HealthCheckRequest, context: Any) -> HealthCheckResponse:
        """Check: the status now; NOT_FOUND for a service the server does not know."""
        status = self.status(request.service)
        if status is ServingStatus.SERVICE_UNKNOWN:
            raise ModelNotFound(f"unknown service '{request.service}'")
        return HealthCheckResponse(status)

    # -- Watch -----------------------------------------------------------------------------
    def watch(self, service: str, send: Send) -> Watcher:
        """Open a Watch: ``send`` gets the status now and each change; ``unwatch`` ends it."""
        if self._closed:
            raise NotReady("the server is shutting down")
        if len(self.watchers) >= MAX_WATCHERS:
            raise TooManyWatchers(f"too many health watches open (at most {MAX_WATCHERS})")
        watcher = Watcher(service, send)
        self.watchers.add(watcher)
        watcher.offer(self.status(service))
        if self._poller is None:
            self._poller = asyncio.ensure_future(self._poll())
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)
        if not self.watchers and self._poller is not None:
            self._poller.cancel()
            self._poller = None

    def close(self) -> None:
        """The server stops: every Watch gets the final status, then ends; no new ones."""
        self._closed = True
        self._offer_all()
        for watcher in self.watchers:
            if not watcher.ended.done():
                watcher.ended.set_result(None)
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            try:
                self._offer_all()
            except Exception:  # a bug; logged, and the Watches go on
                logger.exception("grpc.health.v1 Watch round failed")

    def _offer_all(self) -> None:
        statuses: dict[str, ServingStatus] = {}
        for watcher in list(self.watchers):
            status = statuses.get(watcher.service)
            if status is None:
                status = statuses[watcher.service] = self.status(watcher.service)
            watcher.offer(status)
