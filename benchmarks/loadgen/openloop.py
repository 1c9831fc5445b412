"""Open-loop REST load generator: a fixed arrival rate, latency from the intended send time.

Request ``k`` is due at ``t0 + k / rate`` whatever the server does: a closed-loop client
waits for its answer before sending the next, so a stalled server would slow the clients
down and hide its queue (coordinated omission). Here a request that finds every
connection busy waits in the generator's backlog, and its latency still counts from the
moment it was due. Answers are split by status: admitted (200), rejected (503 and 429,
the server shedding load) and errors (anything else, a dropped connection, no answer
before the end of the grace period); each class keeps its own latencies.

Built for rate, since it shares the 2-core machine with the server: uvloop when installed,
``asyncio.Protocol`` connections (no streams), the request bytes built once, answers
parsed by their Content-Length only. It runs as a child process
(``python -m benchmarks.loadgen.openloop SPEC.json``) so its CPU is measured like the other
generators'; :func:`generate` is the coroutine, for tests.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.loadgen.base import run_child
from benchmarks.loadgen.builtin import PROJECT_ROOT, http_request
from benchmarks.stats import latency_summary

REJECTED = frozenset({429, 503})
TICK = 0.001  # the pacer's shortest sleep, s
# Latency is stamped with perf_counter: uvloop's loop.time() is cached per iteration and
# counts whole milliseconds.
clock = time.perf_counter


class Tally:
    """What the run saw, by class of answer (one event loop: no locks)."""

    def __init__(self, measure_from: float) -> None:
        self.measure_from = measure_from  # intended times before this are warm-up
        self.admitted: list[float] = []
        self.rejected: list[float] = []
        self.errors: list[float] = []
        self.lag: list[float] = []  # send time - intended time, of requests sent at once
        self.backlogged = 0  # requests that found every connection busy
        self.error_sample = ""

    def record(self, intended: float, now: float, status: int, error: str = "") -> None:
        if intended < self.measure_from:
            return
        latency = (now - intended) * 1e6
        if status == 200:
            self.admitted.append(latency)
        elif status in REJECTED:
            self.rejected.append(latency)
        else:
            self.errors.append(latency)
            self.error_sample = self.error_sample or error or f"HTTP {status}"


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.need = -1  # bytes of the whole answer once its head is parsed
        self.status = 0
        self.intended = -1.0  # the request in flight's due time; -1: none

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.pool.ready(self)

    def send(self, intended: float) -> None:
        self.intended = intended
        assert self.transport is not None
        self.transport.write(self.pool.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.intended >= 0:
            if self.need < 0:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buffer[:end]).lower()
                self.status = int(head[9:12])
                at = head.find(b"\r\ncontent-length:")
                if at < 0:
                    self.fail("answer without Content-Length")
                    return
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : stop if stop > 0 else len(head)])
                self.need = end + 4 + length
            if len(self.buffer) < self.need:
                return
            del self.buffer[: self.need]
            self.need = -1
            intended, self.intended = self.intended, -1.0
            self.pool.answered(self, intended, self.status)

    def fail(self, reason: str) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.lost(self, self.intended, f"connection lost: {exc or 'closed by the server'}")
        self.intended = -1.0


class Pool:
    """Up to ``max_connections`` connections; due requests go to an idle one or wait."""

    def __init__(self, spec: dict[str, Any], tally: Tally) -> None:
        self.host, self.port = spec["host"], spec["port"]
        body = Path(spec["body_file"]).read_bytes()
        self.request = http_request(self.host, self.port, spec["path"], spec["headers"], body)
        self.max_connections = spec["connections"]
        self.tally = tally
        self.loop = asyncio.get_running_loop()
        self.idle: list[Connection] = []
        self.backlog: collections.deque[float] = collections.deque()
        self.opened = 0  # connections open or opening
        self.in_flight = 0

    def dispatch(self, intended: float) -> None:
        self.in_flight += 1
        if self.idle:
            self.tally.lag.append((clock() - intended) * 1e6)
            self.idle.pop().send(intended)
            return
        self.backlog.append(intended)
        self.tally.backlogged += 1
        if self.opened < self.max_connections:
            self.opened += 1
            self.loop.create_task(self.open())

    async def open(self) -> None:
        try:
            await self.loop.create_connection(lambda: Connection(self), self.host, self.port)
        except OSError as exc:
            self.opened -= 1
            if self.backlog:  # a request that waited for this connection fails with it
                self.finish(self.backlog.popleft(), 0, f"connect: {exc}")
            if self.backlog and self.opened < self.max_connections:  # one try per request
                self.opened += 1
                self.loop.create_task(self.open())

    def ready(self, conn: Connection) -> None:
        if self.backlog:
            conn.send(self.backlog.popleft())
        else:
            self.idle.append(conn)

    def finish(self, intended: float, status: int, error: str = "") -> None:
        self.in_flight -= 1
        self.tally.record(intended, clock(), status, error)

    def answered(self, conn: Connection, intended: float, status: int) -> None:
        self.finish(intended, status)
        self.ready(conn)

    def lost(self, conn: Connection, intended: float, error: str) -> None:
        self.opened -= 1
        if conn in self.idle:
            self.idle.remove(conn)
        if intended >= 0:
            self.finish(intended, 0, error)
        if self.backlog and self.opened < self.max_connections:  # replace it for the waiting
            self.opened += 1
            self.loop.create_task(self.open())


async def pace(pool: Pool, rate: float, t0: float, total: int) -> None:
    """Dispatch request k at t0 + k / rate (late ones at once, with their due time)."""
    sent = 0
    while sent < total:
        due = min(total, int((clock() - t0) * rate) + 1)
        for k in range(sent, due):
            pool.dispatch(t0 + k / rate)
        sent = max(sent, due)
        # uvloop's timers tick in milliseconds: a shorter sleep would spin. The requests
        # due meanwhile leave together, late by under a tick, and that lag is in their
        # latency (and in ``lag_us``).
        await asyncio.sleep(max(TICK, t0 + sent / rate - clock()))


async def generate(spec: dict[str, Any]) -> dict[str, Any]:
    """Offer ``rate`` requests/s for ``duration`` s (the first ``warmup`` s not counted),
    then wait up to ``grace`` s for the answers still due."""
    rate, duration, warmup = spec["rate"], spec["duration"], spec.get("warmup", 0.0)
    t0 = clock() + 0.05
    tally = Tally(measure_from=t0 + warmup)
    pool = Pool(spec, tally)
    total = int((warmup + duration) * rate)
    await pace(pool, rate, t0, total)
    deadline = clock() + spec.get("grace", 5.0)
    while pool.in_flight and clock() < deadline:
        await asyncio.sleep(0.01)
    unanswered = pool.in_flight  # still queued or in flight at the deadline
    for conn in list(pool.idle):
        if conn.transport is not None:
            conn.transport.close()
    return {
        "rate": rate,
        "duration": duration,
        "sent": total,
        "admitted": len(tally.admitted),
        "rejected": len(tally.rejected),
        "errors": len(tally.errors) + unanswered,
        "unanswered": unanswered,
        "backlogged": tally.backlogged,
        "admitted_us": latency_summary(tally.admitted),
        "rejected_us": latency_summary(tally.rejected),
        "lag_us": latency_summary(tally.lag),
        "error_sample": tally.error_sample or ("no answer in time" if unanswered else ""),
    }


def run(spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run the generator as a child process; its result with ``generator_cpu`` (s)."""
    spec_file = workdir / "openloop.json"
    spec_file.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "benchmarks.loadgen.openloop", str(spec_file.resolve())]
    timeout = spec.get("warmup", 0.0) + spec["duration"] + spec.get("grace", 5.0) + 30
    child = run_child("open-loop generator", cmd, timeout, cwd=PROJECT_ROOT)
    result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    result["generator_cpu"] = child.cpu_seconds
    return result


def main(argv: list[str]) -> None:
    spec = json.loads(Path(argv[0]).read_text())
    try:
        from uvloop import run as run_loop  # the generator's ceiling is its loop's speed
    except ImportError:
        run_loop = asyncio.run
    started = time.process_time()
    result = run_loop(generate(spec))
    result["own_cpu"] = time.process_time() - started
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
