"""Load with Triton's perf_analyzer, over HTTP (binary tensors) or gRPC (``-i grpc``).

perf_analyzer reads the model's configuration (``/v2/models/{m}/config``) and generates
its own random input of the configured shape and datatype (``-b`` rows per request), so
the payload's body is not replayed: only its model, batch and transport count. Over HTTP
it always sends Triton's binary tensors, over gRPC raw contents: so it measures only the
``rest-binary`` and ``grpc-raw`` scenarios (the others are "n/a"), and only on servers that
serve the model configuration (Triton's extension, which KServe and MLServer lack). It
measures in windows until three agree; with the stability bound lifted
(``--stability-percentage``) that is three windows of a third of the job's duration each
(a second at least). It stops at the first failed request (non-zero exit), so a run that
completes had no errors.

perf_analyzer keys the server's statistics by version and reads every version as a
number (Triton's versions are numbers): the model must have a numbered version (Triton's
layout, or ``parameters.version`` such as "1"; the harness gives its managed servers' models
version "1" in a perf_analyzer run). The highest one is measured (``-x``).

Install it with ``python -m benchmarks install-perf-analyzer`` (which runs
``scripts/install_perf_analyzer.sh``); ``INFERPOOL_PERF_ANALYZER`` names another binary.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx

from benchmarks.loadgen.base import Job, LoadResult, run_child

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = ROOT / "build" / "perf_analyzer" / "perf_analyzer"
INSTALL_SCRIPT = ROOT / "scripts" / "install_perf_analyzer.sh"
INSTALL_HINT = "python -m benchmarks install-perf-analyzer (or set INFERPOOL_PERF_ANALYZER)"
# The scenarios whose bytes perf_analyzer's own requests match (binary tensors, raw contents).
PROTOCOLS = ("rest-binary", "grpc-raw")
PROTOCOL_REASON = "perf_analyzer sends only binary tensors (rest-binary) or raw contents (grpc-raw)"

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


def install() -> Path:
    """Download and unpack perf_analyzer where :func:`find_binary` looks (a few seconds
    from a local package mirror; libb64-0d comes from apt)."""
    dest = INSTALLED.parent
    subprocess.run(["sh", str(INSTALL_SCRIPT), str(dest)], check=True, cwd=ROOT)
    return INSTALLED


def config_missing(http_base: str, model: str) -> str:
    """Why perf_analyzer cannot drive ``model`` on the server ("" when it can): it reads the
    model configuration (Triton's extension) before its first request. An unreachable
    server is not a missing feature: "" too, so the scenario's check fails it."""
    path = f"/v2/models/{model}/config"
    try:
        status = httpx.get(http_base + path, timeout=10).status_code
    except httpx.HTTPError:
        return ""
    if status == 200:
        return ""
    return f"no model configuration (GET {path}: HTTP {status}), which perf_analyzer reads"


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
