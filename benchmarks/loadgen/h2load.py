"""gRPC load with h2load: it posts the framed protobuf body over HTTP/2 (prior knowledge).

h2load sees HTTP statuses only, and gRPC reports failures in trailers with HTTP 200. A
failed call carries no message, so errors are also inferred from the DATA bytes received:
every successful call returns the same response frame, whose length the check measured.
Latency percentiles come from h2load's per-request log.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from benchmarks.loadgen.base import Job, LoadResult, run_child
from benchmarks.stats import latency_summary

REQUESTS = re.compile(
    r"requests: (?P<total>\d+) total, (?P<started>\d+) started, (?P<done>\d+) done, "
    r"(?P<succeeded>\d+) succeeded, (?P<failed>\d+) failed, (?P<errored>\d+) errored, "
    r"(?P<timeout>\d+) timeout"
)
FINISHED = re.compile(r"finished in (?P<seconds>[\d.]+)(?P<unit>m?s),")
DATA_BYTES = re.compile(r"traffic: .*\((?P<bytes>\d+)\) data")


def command(
    url: str,
    body_file: Path,
    headers: dict[str, str],
    concurrency: int,
    duration: float,
    log_file: Path,
) -> list[str]:
    """One thread, one stream per connection: concurrency means open connections."""
    cmd = [
        "h2load",
        "-t1",
        f"-c{concurrency}",
        "-m1",
        f"-D{max(1, math.ceil(duration))}",
        "-d",
        str(body_file),
        f"--log-file={log_file}",
    ]
    for name, value in headers.items():
        cmd += ["-H", f"{name}: {value}"]
    return [*cmd, url]


def parse(stdout: str, log_text: str, response_bytes: int | None) -> LoadResult:
    """Counts from h2load's summary, latencies from its log (µs in the third column)."""
    counts = REQUESTS.search(stdout)
    finished = FINISHED.search(stdout)
    if counts is None or finished is None:
        raise ValueError(f"h2load printed no summary:\n{stdout[-2000:]}")
    done = int(counts["done"])
    succeeded = int(counts["succeeded"])
    errors = done - succeeded + int(counts["timeout"])
    sample = f"{done - succeeded} HTTP failures" if done != succeeded else ""
    data = DATA_BYTES.search(stdout)
    if response_bytes and data is not None:
        answered = int(data["bytes"]) // response_bytes
        grpc_failures = max(0, succeeded - answered)
        errors += grpc_failures
        if grpc_failures:
            sample = f"{grpc_failures} calls answered without a response message (gRPC error)"
    seconds = float(finished["seconds"]) / (1000 if finished["unit"] == "ms" else 1)
    latencies = [float(row.split("\t")[2]) for row in log_text.splitlines() if row.count("\t") >= 2]
    if len(latencies) != done:
        raise ValueError(f"h2load logged {len(latencies)} requests but completed {done}")
    return LoadResult(
        requests=done + int(counts["timeout"]),
        errors=errors,
        duration=seconds,
        latency_us=latency_summary(latencies),
        error_sample=sample,
    )


def run(job: Job) -> LoadResult:
    """Post the gRPC frame for the job's duration over its connections."""
    log_file = (job.workdir / "h2load.log").resolve()
    log_file.unlink(missing_ok=True)  # h2load appends: old rows would pass as this run's
    cmd = command(
        job.url, job.body_file(), job.payload.headers, job.concurrency, job.duration, log_file
    )
    child = run_child("h2load", cmd, job.timeout)
    log_text = log_file.read_text() if log_file.exists() else ""
    result = parse(child.stdout, log_text, job.response_bytes)
    result.generator_cpu = child.cpu_seconds
    return result
