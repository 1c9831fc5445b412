"""REST load with wrk: a Lua script posts the payload body; its done() hook prints JSON.

wrk runs one thread (``-t1``): on a 2-core box every cycle it spends is taken from the
server, and one epoll thread drives 64 keep-alive connections easily.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.loadgen.base import Job, LoadResult, run_child

MARK = "BENCH_JSON "

# %s slots: body file, headers, then the done() hook. Percentiles are in microseconds.
SCRIPT = """\
local file = assert(io.open(%s, "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
%s
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%s{"requests":%%d,"duration_us":%%d,"connect":%%d,"read":%%d,"write":%%d,'
    .. '"status":%%d,"timeout":%%d,"p50":%%d,"p90":%%d,"p99":%%d,"max":%%d,"mean":%%.1f}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
"""


def lua_string(text: str) -> str:
    """A Lua string literal (JSON escaping is valid Lua for the ASCII we emit)."""
    return json.dumps(text)


def script(body_file: Path, headers: dict[str, str]) -> str:
    """The wrk Lua script that posts ``body_file`` with ``headers``."""
    header_lines = "\n".join(
        f"wrk.headers[{lua_string(k)}] = {lua_string(v)}" for k, v in headers.items()
    )
    return SCRIPT % (lua_string(str(body_file)), header_lines, MARK)


def command(url: str, script_file: Path, concurrency: int, duration: float) -> list[str]:
    seconds = max(1, math.ceil(duration))
    return [
        "wrk",
        "-t1",
        f"-c{concurrency}",
        f"-d{seconds}s",
        "--timeout",
        "10s",
        "-s",
        str(script_file),
        url,
    ]


def parse(stdout: str) -> LoadResult:
    """Read the JSON line our done() hook prints (wrk's own text has rounded units)."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        raise ValueError(f"wrk printed no result line:\n{stdout[-2000:]}")
    data = json.loads(line[len(MARK) :])
    socket_errors = sum(data[k] for k in ("connect", "read", "write", "timeout"))
    # summary.requests counts non-2xx responses too; connection errors never completed.
    return LoadResult(
        requests=data["requests"] + socket_errors,
        errors=data["status"] + socket_errors,
        duration=data["duration_us"] / 1e6,
        latency_us={k: float(data[k]) for k in ("p50", "p90", "p99", "max", "mean")},
        error_sample=f"{data['status']} non-2xx, socket errors {socket_errors}"
        if data["status"] or socket_errors
        else "",
    )


def run(job: Job) -> LoadResult:
    """Post the payload for the job's duration (wrk sees statuses: no response_bytes)."""
    script_file = job.workdir / "post.lua"
    script_file.write_text(script(job.body_file(), job.payload.headers))
    cmd = command(job.url, script_file, job.concurrency, job.duration)
    child = run_child("wrk", cmd, job.timeout)
    result = parse(child.stdout)
    result.generator_cpu = child.cpu_seconds
    return result
