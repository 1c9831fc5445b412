"""Open client connections of every frontend together, under one cap.

Each frontend registers a connection when it is accepted and releases it when it closes.
At the cap, a new connection takes the place of the one that has been idle (no request
in flight) the longest, so idle keep-alive connections can never lock out a health
check; only when every connection is busy is the new one refused. The cap is also
bounded by the file descriptors the process may open, less a reserve kept for the
workers, their rings and doorbells, and large payloads passed as memfds.
"""

from __future__ import annotations

import logging
import resource
import time
from typing import Protocol

from inferpool.frontends.metrics_server import count_rejected

logger = logging.getLogger(__name__)

# Descriptors kept back from client connections: listening sockets, per-worker rings,
# doorbells and channels, memfds of large payloads, log files, imports.
FD_RESERVE = 256


class Tracked(Protocol):
    """A connection as the registry sees it."""

    # time.monotonic() since when no request has been in flight; None while one is.
    idle_since: float | None
    # Its frontend ("rest", "grpc", "metrics"), named when it is refused.
    frontend: str

    def close_idle(self) -> None:
        """Close it now (it is idle): the registry needs its place."""


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open-file limit from %d: %s", soft, exc)
    return soft


class Connections:
    """Every open client connection of the server, with the cap on their number."""

    def __init__(self, limit: int, fd_limit: int | None = None) -> None:
        if fd_limit is not None:
            limit = min(limit, max(16, fd_limit - FD_RESERVE))
        self.limit = limit
        self.open: set[Tracked] = set()
        self.refused = 0  # connections turned away: every open one was busy
        self.evicted = 0  # idle connections closed to make room
        self._warned_at = 0.0

    def admit(self, connection: Tracked) -> bool:
        """Count a new connection in; False when it must be closed at once."""
        if len(self.open) >= self.limit and not self._evict_idlest():
            self.refused += 1
            count_rejected(connection.frontend, "max_connections")
            self._warn("all %d connections are busy; refusing a new one", self.limit)
            return False
        self.open.add(connection)
        return True

    def release(self, connection: Tracked) -> None:
        self.open.discard(connection)

    def _evict_idlest(self) -> bool:
        idle = [c for c in self.open if c.idle_since is not None]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.idle_since)  # type: ignore[arg-type,return-value]
        self.open.discard(victim)
        self.evicted += 1
        self._warn("%d connections open (the limit); closing the longest idle", self.limit)
        victim.close_idle()
        return True

    def _warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._warned_at >= 10:  # once per 10 s: a flood must not flood the log
            self._warned_at = now
            logger.warning(message, *args)
