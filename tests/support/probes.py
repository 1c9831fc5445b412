"""What an adversarial test watches while it attacks a server: fresh health checks on a
thread (``HealthProbe``: every one must answer, and quickly) and the memory of a process
(``rss_mib``, ``peak_rss_mib``)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from tests.support import Server

HEALTH_REQUEST = b"GET /v2/health/live HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"


def health_latency(server: Server) -> float:
    """Seconds a fresh health check takes; it must answer 200.

    A bare socket rather than ``httpx.get``: that builds a client and its TLS context on
    every call (about 18 ms of CPU, holding the GIL against the attack in the same
    process), which on a loaded CI host made the probe measure itself rather than the
    server."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(HEALTH_REQUEST)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    return time.monotonic() - started


class HealthProbe:
    """Health checks on fresh connections, every 0.1 s in a thread, while a test attacks."""

    def __init__(self, server: Server, limit: float = 1.5) -> None:
        self.server = server
        self.limit = limit
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                self.latencies.append(health_latency(self.server))
            except (OSError, AssertionError) as exc:
                self.errors.append(repr(exc))
            self._stop.wait(0.1)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(15)
        assert not self.errors, self.errors
        assert self.latencies, "no health check ran"
        assert max(self.latencies) < self.limit, self.latencies


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")
