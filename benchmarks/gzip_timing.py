"""``python -m benchmarks.gzip_timing``: what gzipping an answer costs (``gzip_enabled``).

``zlib`` (the default): in-process, the CPU time zlib takes to gzip V2 JSON answers of
several sizes at levels 1, 3, 6 and 9, and ISA-L at its level 1 when ``isal`` is
installed (best of several runs, microseconds of CPU), and the compressed size's share of
the answer. Two kinds of answer: ``predict_proba`` of three
classes (FP64 numbers of 17 digits, as orjson writes them) and class labels (INT64).

``served``: starts ``inferpool serve`` on the iris model of the benchmark repository,
drives its REST infer route with ``wrk`` for answers of 1, 256 and 4096 rows of
probabilities, each with ``Accept-Encoding: identity`` and ``gzip``, and prints
requests/s, the mean latency and the server's CPU time per request (frontend, template
and workers together, from psutil).

Examples::

    python -m benchmarks.gzip_timing
    python -m benchmarks.gzip_timing served --duration 10 --connections 16
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

SIZES = (300, 1024, 4096, 16 * 1024, 64 * 1024, 1024 * 1024)
LEVELS = (1, 3, 6, 9)
GZIP_WBITS = 16 + zlib.MAX_WBITS


def probabilities_answer(size: int) -> bytes:
    """A V2 JSON answer of ``predict_proba`` (3 classes) of about ``size`` bytes."""
    rng = np.random.default_rng(0)
    rows = max(1, size // 60)
    while True:
        data = rng.dirichlet([1.0, 1.0, 1.0], size=rows)
        output = {"name": "predict_proba", "datatype": "FP64", "shape": [rows, 3]}
        output["data"] = data.ravel().tolist()
        body = orjson.dumps({"model_name": "m", "id": "1", "outputs": [output]})
        if len(body) >= size or rows > 10**7:
            return body
        rows = int(rows * size / len(body)) + 1


def labels_answer(size: int) -> bytes:
    """A V2 JSON answer of class labels (INT64, 0..2) of about ``size`` bytes."""
    rng = np.random.default_rng(0)
    rows = max(1, (size - 80) // 2)
    output = {"name": "predict", "datatype": "INT64", "shape": [rows]}
    output["data"] = rng.integers(0, 3, rows).tolist()
    return orjson.dumps({"model_name": "m", "id": "1", "outputs": [output]})


def best_microseconds(compress: Callable[[], bytes], budget: float = 0.3) -> float:
    """The fastest of several timed batches of ``compress()``, per call, in this process's
    CPU time (on a shared machine, wall time counts the other processes' turns too)."""
    calls = 1
    while True:  # enough calls per batch to last about 20 ms
        started = time.process_time()
        for _ in range(calls):
            compress()
        elapsed = time.process_time() - started
        if elapsed > 0.02 or calls > 10_000:
            break
        calls *= 4
    best = elapsed / calls
    deadline = time.process_time() + budget
    while time.process_time() < deadline:
        started = time.process_time()
        for _ in range(calls):
            compress()
        best = min(best, (time.process_time() - started) / calls)
    return best * 1e6


def zlib_table() -> None:
    from inferpool.frontends.gzip_codec import _isal

    isal = _isal()  # ISA-L's compressor (the server's when installed), at level 1
    header = f"{'answer':<14}{'bytes':>9}" + "".join(
        f"{f'L{level} us':>11}{'size':>6}" for level in LEVELS
    )
    print(header + (f"{'isal1 us':>11}{'size':>6}" if isal is not None else ""))
    for kind, make in (("probabilities", probabilities_answer), ("labels", labels_answer)):
        for size in SIZES:
            body = make(size)
            cells = []
            for level in LEVELS:
                compressed = zlib.compress(body, level, wbits=GZIP_WBITS)
                micros = best_microseconds(
                    lambda b=body, lv=level: zlib.compress(b, lv, wbits=GZIP_WBITS)
                )
                cells.append(f"{micros:>11.1f}{len(compressed) / len(body):>6.2f}")
            if isal is not None:
                compressed = isal(body, 1)
                micros = best_microseconds(lambda b=body: isal(b, 1))  # type: ignore[misc]
                cells.append(f"{micros:>11.1f}{len(compressed) / len(body):>6.2f}")
            print(f"{kind:<14}{len(body):>9}" + "".join(cells), flush=True)


# -- served ---------------------------------------------------------------------------------
LUA = """wrk.method = "POST"
wrk.body = io.open(%r, "rb"):read("*a")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept-Encoding"] = %r
"""


def served(duration: int, connections: int, workers: int) -> None:
    import httpx
    import psutil

    from benchmarks.models import build_repository
    from tests.support import free_port, wait_for_200

    with tempfile.TemporaryDirectory(prefix="gzip-timing-") as tmp:
        root = Path(tmp)
        repository = build_repository(root / "repo", ["iris"])
        port = free_port()
        command = [sys.executable, "-m", "inferpool", "serve", str(repository)]
        command += ["--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", "-1"]
        command += ["--metrics-port", "-1", "--workers", str(workers)]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for_200(url + "/v2/health/ready", server, lambda: "(output not kept)", 120)
            process = psutil.Process(server.pid)
            print(
                f"{'rows':>6}{'answer':>10}{'accept':>10}{'req/s':>10}{'mean ms':>9}"
                f"{'CPU us/req':>12}{'wire bytes':>12}"
            )
            for rows in (1, 256, 4096):
                body_file = root / f"body-{rows}.json"
                # Rows across iris's ranges: each answer row differs, as real ones do.
                rng = np.random.default_rng(rows)
                X = rng.uniform([4.3, 2.0, 1.0, 0.1], [7.9, 4.4, 6.9, 2.5], (rows, 4)).round(1)
                tensor = {"name": "x", "shape": [rows, 4], "datatype": "FP32"}
                tensor["data"] = X.ravel().tolist()
                body = {"inputs": [tensor], "outputs": [{"name": "predict_proba"}]}
                body_file.write_bytes(orjson.dumps(body))
                for accept in ("identity", "gzip"):
                    headers = {"Accept-Encoding": accept}
                    sample = httpx.post(
                        url + "/v2/models/iris/infer",
                        content=body_file.read_bytes(),
                        headers=headers,
                        timeout=30,
                    )
                    script = root / f"post-{rows}-{accept}.lua"
                    script.write_text(LUA % (str(body_file), accept))
                    cpu_before = _tree_cpu(process)
                    output = subprocess.run(
                        ["wrk", "-t1", f"-c{connections}", f"-d{int(duration)}s", "-s", str(script),
                         url + "/v2/models/iris/infer"],
                        capture_output=True, text=True, check=True,
                    ).stdout  # fmt: skip
                    cpu = _tree_cpu(process) - cpu_before
                    requests = int(re.search(r"(\d+) requests in", output).group(1))  # type: ignore[union-attr]
                    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
                    mean = re.search(r"Latency\s+([\d.]+)(us|ms|s)", output)
                    assert mean is not None
                    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[mean.group(2)]
                    print(f"{rows:>6}{len(sample.content):>10}{accept:>10}{rate:>10.0f}"
                          f"{float(mean.group(1)) * scale:>9.2f}{cpu / requests * 1e6:>12.1f}"
                          f"{sample.num_bytes_downloaded:>12}", flush=True)  # fmt: skip
        finally:
            server.terminate()
            server.wait(30)


def _tree_cpu(process: object) -> float:
    """User + system CPU seconds of a process and its children, alive now."""
    import psutil

    assert isinstance(process, psutil.Process)
    total = 0.0
    for member in [process, *process.children(recursive=True)]:
        try:
            times = member.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gzip_timing", description=__doc__)
    parser.add_argument("what", nargs="?", choices=("zlib", "served"), default="zlib")
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.what == "zlib":
        zlib_table()
    else:
        served(args.duration, args.connections, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
