"""What every generator takes (a Job) and returns (a LoadResult), and how it is run.

``run_child`` starts a generator process and reaps it with ``os.wait4`` so the CPU it
used (user + system) is known exactly, whatever the generator.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.payloads import Payload


@dataclass(frozen=True)
class Target:
    """Where a server listens."""

    host: str
    http_port: int | None
    grpc_port: int | None

    def port_for(self, transport: str) -> int:
        port = self.grpc_port if transport == "grpc" else self.http_port
        if port is None:
            raise ValueError(f"target has no {transport} port")
        return port


@dataclass(frozen=True)
class Job:
    """One load run: where, what, how many connections, how long, where to keep files."""

    target: Target
    payload: Payload
    concurrency: int
    duration: float
    workdir: Path
    # The response size the check measured; h2load infers gRPC errors from it.
    response_bytes: int | None = None

    @property
    def url(self) -> str:
        port = self.target.port_for(self.payload.transport)
        return f"http://{self.target.host}:{port}{self.payload.path}"

    def body_file(self) -> Path:
        """The payload body as a file, which every generator reads (absolute: tools chdir)."""
        path = (self.workdir / "body.bin").resolve()
        path.write_bytes(self.payload.body)
        return path

    @property
    def timeout(self) -> float:
        """How long the generator may take before it is killed."""
        return self.duration + 30


@dataclass
class LoadResult:
    """One measurement: completed requests, errors, elapsed time, latency, generator CPU."""

    requests: int
    errors: int
    duration: float
    latency_us: dict[str, float] = field(default_factory=dict)
    generator_cpu: float = math.nan
    error_sample: str = ""

    @property
    def ok(self) -> int:
        return max(0, self.requests - self.errors)

    @property
    def rps(self) -> float:
        """Successful requests per second."""
        return self.ok / self.duration if self.duration > 0 else math.nan

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "rps": self.rps}


@dataclass(frozen=True)
class ChildRun:
    returncode: int
    stdout: str
    stderr: str
    cpu_seconds: float


def run_child(name: str, cmd: list[str], timeout: float, cwd: Path | None = None) -> ChildRun:
    """Run ``cmd`` to completion (killed after ``timeout`` s) and measure its CPU time;
    a non-zero exit raises with the end of its stderr."""
    # Temporary files, not pipes: we reap with wait4 ourselves, so nothing may block on a
    # full pipe while we poll.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=cwd)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.kill(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)  # tell Popen it is reaped
        out.seek(0)
        err.seek(0)
        child = ChildRun(
            returncode=proc.returncode,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
            cpu_seconds=usage.ru_utime + usage.ru_stime,
        )
    if child.returncode != 0:
        raise RuntimeError(f"{name} exited {child.returncode}: {child.stderr[-800:]}")
    return child
