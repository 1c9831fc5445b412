"""``python -m benchmarks.rejection_cost``: the frontend's CPU per refused request.

Issue 44's fourth target: what a 503 for a full queue costs the server process. A custom
model sleeps 30 s; with ``--workers 2 --max-queue 1 --stall-threshold 0`` two requests fill
both queues and every request after them is refused. The open-loop generator
(``loadgen.openloop``) then offers ``--rate`` requests a second of a 135 KB JSON body for
``--seconds``; printed as one JSON line: requests refused, their p50/p99, and the server
process's user+system CPU over the run divided by the refusals (the workers are other
processes). ``--checkout``: where inferpool is imported from (a checkout of another commit,
its kernels built, to compare).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.loadgen import openloop
from benchmarks.ports import free_port
from tests.support import wait_for_200

RUNTIME = """
import time

from inferpool import Runtime


class Sleeper(Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        time.sleep(30)
        return {outputs[0]: payload.sum(axis=1)}
"""


def write_repository(root: Path) -> Path:
    """The sleeping model's repository under ``root``; the body file beside it."""
    folder = root / "repo" / "sleeper"
    folder.mkdir(parents=True)
    (folder / "sleeper_runtime.py").write_text(RUNTIME)
    settings = {
        "name": "sleeper",
        "implementation": "sleeper_runtime.Sleeper",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 50]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
    }
    (folder / "model-settings.json").write_text(json.dumps(settings))
    rows = [[round(0.123456 * (i + j), 6) for j in range(50)] for i in range(256)]
    tensor = {"name": "x", "datatype": "FP32", "shape": [256, 50], "data": rows}
    (root / "body.json").write_bytes(json.dumps({"inputs": [tensor]}).encode())
    return root / "repo"


def start(repository: Path, checkout: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "inferpool", "serve", str(repository), "--workers", "2",
        "--max-queue", "1", "--stall-threshold", "0", "--host", "127.0.0.1",
        "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def measure(checkout: Path, rate: float, seconds: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="rejection-cost-"))
    repository = write_repository(work)
    body = (work / "body.json").read_bytes()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start(repository, checkout, port, work / "server.log")
    try:
        wait_for_200(url + "/v2/health/ready", server, lambda: "(see server.log)", 120)
        for _ in range(2):  # one request on each worker: both queues full
            post = lambda: httpx.post(url + "/v2/models/sleeper/infer", content=body, timeout=60)  # noqa: E731
            threading.Thread(target=post, daemon=True).start()
        time.sleep(1.0)
        spec = {
            "host": "127.0.0.1", "port": port, "path": "/v2/models/sleeper/infer",
            "headers": {"content-type": "application/json"}, "body_file": str(work / "body.json"),
            "connections": 512, "rate": rate, "duration": seconds, "warmup": 0.0, "grace": 5.0,
        }  # fmt: skip
        process = psutil.Process(server.pid)
        before = process.cpu_times()
        result = openloop.run(spec, work)
        after = process.cpu_times()
    finally:
        server.terminate()
        server.wait(60)
    used = (after.user + after.system) - (before.user + before.system)
    refused = result["rejected"]
    return {
        "checkout": str(checkout),
        "rate": rate,
        "body_bytes": len(body),
        "refused": refused,
        "admitted": result["admitted"],
        "errors": result["errors"],
        "refused_p50_ms": result["rejected_us"]["p50"] / 1e3,
        "refused_p99_ms": result["rejected_us"]["p99"] / 1e3,
        "frontend_cpu_s": round(used, 3),
        "frontend_us_per_refusal": round(1e6 * used / max(1, refused), 1),
        "load_average": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rejection_cost")
    parser.add_argument("--checkout", type=Path, default=Path.cwd(), help="inferpool's tree")
    parser.add_argument("--rate", type=float, default=1000.0, help="requests offered a second")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long they are offered")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.checkout.resolve(), args.rate, args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
