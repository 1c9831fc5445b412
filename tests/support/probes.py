"""What an adversarial test watches while it attacks a server: fresh health checks on a
thread (``HealthProbe``: every one must answer, and quickly) and the memory of a process
(``rss_mib``, ``peak_rss_mib``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from tests.support import Server


def health_latency(server: Server) -> float:
    """Seconds a fresh health check takes; it must answer 200."""
    started = time.monotonic()
    response = httpx.get(server.url + "/v2/health/live", timeout=10)
    assert response.status_code == 200, response.text
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
            except (httpx.HTTPError, AssertionError) as exc:
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
