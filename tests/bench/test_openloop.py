"""The open-loop generator's accounting, against an in-process fixed-reply server that
stalls or sheds load as told (benchmarks.fixed_reply): latency counts from each request's
intended send time, rejections and errors apart from admitted answers, warm-up left out.
And the overload verdict's arithmetic."""

import asyncio
import math
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.fixed_reply import Behaviour, serve
from benchmarks.loadgen import openloop
from benchmarks.overload import verdict
from tests.support import free_port


def spec(tmp_path: Path, port: int, **fields) -> dict:
    body = tmp_path / "body.bin"
    body.write_bytes(b'{"inputs": []}' * 100)
    return {
        "host": "127.0.0.1",
        "port": port,
        "path": "/v2/models/m/infer",
        "headers": {"Content-Type": "application/json"},
        "body_file": str(body),
        "connections": 8,
        "warmup": 0.0,
        "grace": 10.0,
        **fields,
    }


def against(behaviour: Behaviour, tmp_path: Path, stall: float = 0.0, **fields) -> dict:
    """Run the generator against the server in one event loop; ``stall``: answers are
    held until that many seconds after the start."""

    async def main() -> dict:
        port = free_port()
        server = await serve(port, behaviour)
        behaviour.stall_until = asyncio.get_running_loop().time() + stall if stall else 0.0
        try:
            return await openloop.generate(spec(tmp_path, port, **fields))
        finally:
            server.close()

    return asyncio.run(main())


def test_a_stall_shows_in_every_request_due_during_it(tmp_path):
    # 200 requests/s for 1 s; nothing is answered for the first 0.5 s. Only 8 connections:
    # a closed-loop client would send 8 requests, wait, and report 8 slow answers; here
    # the ~100 requests due in the stall all wait, and each counts from when it was due.
    result = against(Behaviour(), tmp_path, stall=0.5, rate=200, duration=1.0)
    assert result["admitted"] == 200 and result["errors"] == 0 and result["rejected"] == 0
    admitted = result["admitted_us"]
    assert admitted["max"] >= 0.45e6  # the first request waited the whole stall
    # The slowest 10% were due in the stall's first 0.1 s: they waited over 0.35 s.
    assert admitted["p90"] >= 0.35e6
    # All but the 8 in flight waited in the generator, and count all the same.
    assert result["backlogged"] >= 80


def test_rejections_are_counted_apart_and_warmup_is_left_out(tmp_path):
    # Every 4th request is shed (503); 0.25 s of warm-up then 0.5 s measured at 200/s:
    # 150 requests sent, the last 100 counted.
    behaviour = Behaviour(reject_every=4)
    result = against(behaviour, tmp_path, rate=200, duration=0.5, warmup=0.25)
    assert behaviour.requests == result["sent"] == 150
    assert result["admitted"] + result["rejected"] == 100
    assert 23 <= result["rejected"] <= 27  # every 4th of the 100 counted, give or take the edge
    assert result["errors"] == 0
    assert not math.isnan(result["rejected_us"]["p99"])
    assert result["rejected_us"]["p99"] < 1e6


def test_a_server_that_is_not_there_is_errors_not_answers(tmp_path):
    async def main() -> dict:
        return await openloop.generate(spec(tmp_path, free_port(), rate=100, duration=0.2))

    result = asyncio.run(main())
    assert result["admitted"] == result["rejected"] == 0
    assert result["errors"] == result["sent"] == 20
    assert "connect" in result["error_sample"]


def test_the_generator_runs_as_a_child_process(tmp_path):
    # Both as the overload command runs them: `python -m benchmarks.fixed_reply PORT` and
    # `python -m benchmarks.loadgen.openloop SPEC.json`, its CPU measured.
    port = free_port()
    command = [sys.executable, "-m", "benchmarks.fixed_reply", str(port), "100"]
    server = subprocess.Popen(command, cwd=openloop.PROJECT_ROOT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.05)
        result = openloop.run(spec(tmp_path, port, rate=100, duration=0.3), tmp_path)
    finally:
        server.kill()
        server.wait()
    assert result["admitted"] == 30 and result["errors"] == 0
    assert result["generator_cpu"] > 0


def rows(server: str, p99_half: float, p99_double: float, reject_ms: float, kept: float):
    base = {"server": server, "capacity": 1000.0, "rejected_p99_ms": math.nan}
    return [
        {**base, "load": "0.5x", "admitted_p99_ms": p99_half, "admitted_rps": 500.0},
        {**base, "load": "1.5x", "admitted_p99_ms": p99_double, "admitted_rps": 1000.0,
         "rejected_p99_ms": reject_ms},
        {**base, "load": "2.0x", "admitted_p99_ms": p99_double, "admitted_rps": 1000 * kept,
         "rejected_p99_ms": reject_ms},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("p99_double", "reject_ms", "kept", "met"),
    [(25.0, 2.0, 0.95, (True, True, True)), (40.0, 9.0, 0.8, (False, False, False))],
)
def test_verdict_against_the_issue_targets(p99_double, reject_ms, kept, met):
    checks = verdict(rows("a", 10.0, p99_double, reject_ms, kept), "a")
    assert checks["p99_2x_over_0.5x"] == pytest.approx(p99_double / 10.0)
    assert checks["rejection_p99_ms"] == reject_ms
    assert checks["admitted_2x_over_capacity"] == pytest.approx(kept)
    names = ("p99_target_met", "rejection_target_met", "throughput_target_met")
    assert tuple(checks[name] for name in names) == met
