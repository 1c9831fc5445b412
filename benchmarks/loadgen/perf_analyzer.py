"""Load with Triton's perf_analyzer, over HTTP (binary tensors) or gRPC (``-i grpc``).

perf_analyzer reads the model's configuration (``/v2/models/{m}/config``) and generates
its own random input of the configured shape and datatype (``-b`` rows per request), so
the payload's body is not replayed: only its model, batch and transport count. Over HTTP
it always sends Triton's binary tensors. It measures in windows until three agree; with
the stability bound lifted (``--stability-percentage``) that is three windows of a third
of the job's duration each (a second at least). It stops at the first failed request
(non-zero exit), so a run that completes had no errors.

perf_analyzer keys the server's statistics by version and reads every version as a
number (Triton's versions are numbers): the model must have a numbered version (Triton's
layout, or ``parameters.version`` such as "1"). The highest one is measured (``-x``).

Install it with ``scripts/install_perf_analyzer.sh``; ``INFERPOOL_PERF_ANALYZER`` names
another binary.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path

import httpx

from benchmarks.loadgen.base import Job, LoadResult, run_child

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = ROOT / "build" / "perf_analyzer" / "perf_analyzer"
INSTALL_HINT = "scripts/install_perf_analyzer.sh (or set INFERPOOL_PERF_ANALYZER)"

REQUESTS = re.compile(r"Request count: (?P<count>\d+)")
THROUGHPUT = re.compile(r"Throughput: (?P<rate>[\d.]+) infer/sec")
PERCENTILE = re.compile(r"p(?P<rank>\d+) latency: (?P<us>\d+) usec")
MEAN = re.compile(r"Avg latency: (?P<us>\d+) usec")


def find_binary() -> str | None:
    """perf_analyzer: ``INFERPOOL_PERF_ANALYZER``, the install script's place, or PATH."""
    named = os.environ.get("INFERPOOL_PERF_ANALYZER")
    if named:
        return named
    if INSTALLED.exists():
        return str(INSTALLED)
    return shutil.which("perf_analyzer")


def numbered_version(http_base: str, model: str) -> str:
    """The model's highest numbered version, from its metadata; ValueError without one."""
    response = httpx.get(f"{http_base}/v2/models/{model}", timeout=10)
    response.raise_for_status()
    numbers = [v for v in response.json().get("versions") or [] if str(v).isdigit()]
    if not numbers:
        raise ValueError(
            f"perf_analyzer needs a numbered version of model '{model}' (Triton's layout, "
            'or parameters.version such as "1"): it reads every version as a number'
        )
    return max(numbers, key=int)


def command(
    binary: str,
    model: str,
    version: str,
    url: str,
    protocol: str,
    batch: int,
    concurrency: int,
    duration: float,
) -> list[str]:
    """Three windows of a third of ``duration`` each (a second at least: a shorter window
    may see no slow request complete) at a fixed concurrency."""
    window_ms = max(1000, math.ceil(duration * 1000 / 3))
    return [
        binary,
        "-m", model,
        "-x", version,
        "-u", url,
        "-i", protocol,
        "-b", str(batch),
        f"--concurrency-range={concurrency}:{concurrency}",
        "--measurement-mode=time_windows",
        f"--measurement-interval={window_ms}",
        "--stability-percentage=999",
    ]  # fmt: skip


def parse(stdout: str, batch: int) -> LoadResult:
    """Requests, throughput and client latencies from perf_analyzer's summary."""
    requests = REQUESTS.search(stdout)
    throughput = THROUGHPUT.search(stdout)
    mean = MEAN.search(stdout)
    if requests is None or throughput is None or mean is None:
        raise ValueError(f"perf_analyzer printed no summary:\n{stdout[-2000:]}")
    count = int(requests["count"])
    rate = float(throughput["rate"]) / batch  # infer/sec counts rows
    latency = {f"p{m['rank']}": float(m["us"]) for m in PERCENTILE.finditer(stdout)}
    summary = {key: latency.get(key, math.nan) for key in ("p50", "p90", "p99")}
    summary.update(max=math.nan, mean=float(mean["us"]))  # perf_analyzer reports no max
    return LoadResult(
        requests=count,
        errors=0,  # perf_analyzer exits non-zero at the first failed request
        duration=count / rate if rate > 0 else math.nan,
        latency_us=summary,
    )


def run(job: Job) -> LoadResult:
    """Drive the job's model at its concurrency for about its duration."""
    binary = find_binary()
    if binary is None:
        raise RuntimeError(f"perf_analyzer is not installed: {INSTALL_HINT}")
    payload, target = job.payload, job.target
    transport = payload.transport
    http_base = f"http://{target.host}:{target.port_for('rest')}"
    version = numbered_version(http_base, payload.model)
    url = f"{target.host}:{target.port_for(transport)}"
    protocol = "grpc" if transport == "grpc" else "http"
    cmd = command(
        binary, payload.model, version, url, protocol, payload.batch, job.concurrency,
        job.duration,
    )  # fmt: skip
    child = run_child("perf_analyzer", cmd, job.timeout)
    result = parse(child.stdout, payload.batch)
    result.generator_cpu = child.cpu_seconds
    return result
