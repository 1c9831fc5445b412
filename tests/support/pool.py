"""Helpers for the worker-pool tests: a counting custom runtime, worker pids, /dev/shm."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.support import Server

# A custom runtime written into a model folder: it sums each row, appends one line per
# predict call (pid and rows) to ``calls_file``, can sleep or hold ballast memory, and
# answers a custom endpoint ``whoami`` with its pid.
COUNTING_RUNTIME = """
import os
import time

import numpy as np

from inferpool import Runtime


class CountingRuntime(Runtime):
    def load(self):
        extra = self.settings.parameters.extra
        self.calls_file = extra["calls_file"]
        self.delay = extra.get("delay", 0)
        self.ballast = np.ones(extra.get("ballast_mb", 0) * 131072)

    def predict(self, payload, outputs):
        with open(self.calls_file, "a") as calls:
            calls.write(f"{os.getpid()} {len(payload)}\\n")
        if self.delay:
            time.sleep(self.delay)
        return {outputs[0]: payload.sum(axis=1)}

    def custom_endpoints(self):
        return {"whoami": lambda body: {"pid": os.getpid(), "bytes": len(body)}}
"""


def write_counting_model(
    root: Path, name: str, calls_file: Path, *, delay: float = 0, **settings: object
) -> Path:
    """A model folder ``root/name`` served by CountingRuntime (module named after it)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    module = "counting_" + name.replace("-", "_")
    (folder / f"{module}.py").write_text(COUNTING_RUNTIME)
    extra = {"calls_file": str(calls_file), "delay": delay}
    extra["ballast_mb"] = settings.pop("ballast_mb", 0)
    document = {
        "name": name,
        "implementation": f"{module}.CountingRuntime",
        "parameters": {"extra": extra},
        "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 3]}],
        "outputs": [{"name": "sum", "datatype": "FP64", "shape": [-1]}],
        **settings,
    }
    (folder / "model-settings.json").write_text(json.dumps(document))
    return folder


# A custom runtime whose worker dies by SIGSEGV when the first value of a request is
# negative, and sums the rows otherwise.
CRASHING_RUNTIME = """
import os
import signal

from inferpool import Runtime


class CrashingRuntime(Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        if payload[0, 0] < 0:
            os.kill(os.getpid(), signal.SIGSEGV)
        return {outputs[0]: payload.sum(axis=1)}
"""


def write_crashing_model(root: Path, name: str, **settings: object) -> Path:
    """A model folder ``root/name`` whose requests with a negative first value crash."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    module = "crashing_" + name.replace("-", "_")
    (folder / f"{module}.py").write_text(CRASHING_RUNTIME)
    document = {
        "name": name,
        "implementation": f"{module}.CrashingRuntime",
        "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 3]}],
        "outputs": [{"name": "sum", "datatype": "FP64", "shape": [-1]}],
        **settings,
    }
    (folder / "model-settings.json").write_text(json.dumps(document))
    return folder


def calls(calls_file: Path) -> list[tuple[int, int]]:
    """(pid, rows) of every predict call so far."""
    if not calls_file.exists():
        return []
    return [tuple(map(int, line.split())) for line in calls_file.read_text().splitlines()]


def sum_request(rows: list[list[float]], request_id: str) -> dict:
    return {
        "id": request_id,
        "inputs": [{"name": "x", "shape": [len(rows), 3], "datatype": "FP64", "data": rows}],
    }


def worker_pids(server: Server) -> dict[int, int]:
    """The latest pid of each worker slot, from the server's log."""
    pids: dict[int, int] = {}
    for slot, pid in re.findall(r"worker (\d+) started \(pid (\d+)\)", server.output()):
        pids[int(slot)] = int(pid)
    return pids


def wait_for(condition, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} not met after {timeout}s")


def shm_listing() -> set[str]:
    return set(os.listdir("/dev/shm"))


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and ") Z " not in stat.read_text()


def children(pid: int) -> dict[int, tuple[str, bytes]]:
    """The child processes of ``pid``: pid → (state letter, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if int(parent) == pid:
            found[int(entry.name)] = (state, cmdline)
    return found


def template_pid(server_pid: int) -> int:
    """The live template process (zygote) under the server."""
    for pid, (state, cmdline) in children(server_pid).items():
        if state != "Z" and b"inferpool.engine.worker.template" in cmdline:
            return pid
    raise AssertionError("no template process under the server")


def live_workers(server: Server) -> set[int]:
    """Pids of the latest worker of each slot that are running."""
    return {pid for pid in worker_pids(server).values() if process_exists(pid)}


def big_knn(seed: int = 0):
    """A classifier that keeps its 40 MB of training data (100,000 rows of 50 doubles), and
    rows to ask it about: big enough that a copy per worker shows in their memory."""
    import numpy as np
    from sklearn.neighbors import KNeighborsClassifier

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(100_000, 50))
    model = KNeighborsClassifier(n_neighbors=3, algorithm="brute")
    return model.fit(X, rng.integers(0, 5, len(X))), X[:5]


def ask_model(server: Server, name: str, rows) -> list:
    """The ``predict`` output of model ``name`` for ``rows`` (FP64) over REST; asserts 200."""
    import httpx

    body = {"inputs": [{"name": "x", "shape": list(rows.shape), "datatype": "FP64",
                        "data": rows.ravel().tolist()}]}  # fmt: skip
    response = httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


def logged_sizes(server: Server, name: str) -> list[float]:
    """The MiB per replica that placement logged for each load of model ``name``."""
    pattern = rf"model '{re.escape(name)}': .*, ([\d.]+) MiB each"
    return [float(size) for size in re.findall(pattern, server.output())]


def assert_only_workers_map(server: Server, library: str) -> None:
    """``library`` (a path or file name in /proc/PID/maps) is mapped by each of the
    server's two workers, and neither by the template that forks them nor by the server's
    own process: a runtime that must start after the fork. Skipped with ``--workers 0``."""
    if server.workers == 0:  # type: ignore[attr-defined]
        pytest.skip("with --workers 0 the server process runs the models")

    def maps(pid: int) -> bool:
        return library in Path(f"/proc/{pid}/maps").read_text()

    workers = live_workers(server)
    assert len(workers) == 2
    assert all(maps(pid) for pid in workers)
    assert not maps(template_pid(server.process.pid))
    assert not maps(server.process.pid)
