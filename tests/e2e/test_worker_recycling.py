"""A leaking model under continuous load is recycled without a failed request
(``--worker-max-requests``, ``--worker-max-rss``; docs/operate/memory.md, "Recycling").

Two workers serve a model that keeps 1-2 MiB more at every call, and iris beside it; three
REST clients and a gRPC one ask both without a pause, until the workers were recycled a
few times. Each worker past its request count, or its private memory, is replaced by a
fresh one forked from the template: every answer is 200, the recycles are counted by
reason on /metrics, and no worker ever held much of what the run leaked (without
recycling, one of the two would hold at least half of it).

The load runs until the recycles happened rather than for a fixed count: a recycle forks
and loads a worker while the old one serves, and on a loaded host (CI runs several tox
environments at once) that takes seconds, so a fixed count saw only three recycles (CI,
2026-12-07) and a worker that overshot its budget by hundreds of requests meanwhile.
``--worker-memory-limit`` is set too, as a safety net: a test that fails must not take the
host's memory.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from tests.support import Server, build_iris_repository
from tests.support.grpc import infer_request, needs_pool, stub_for
from tests.support.memory import recycles, two_columns, workers_private_mib, write_leak
from tests.support.pool import wait_for

pytestmark = [pytest.mark.timeout(600), needs_pool]

IRIS = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [5, 3, 1, 0]}]}
CLIENTS = 4
CALLS = 300  # per client at least, half of them to the leaking model
RECYCLES_WITHIN = 240.0  # seconds the load may run before the recycles expected


class Load:
    """CLIENTS threads (one of them over gRPC) asking the leak and iris in turn, each at
    least CALLS times and until ``enough()`` is true; statuses, the leaking calls sent, and
    the largest private memory of any worker seen meanwhile."""

    def __init__(self, server: Server, enough: Callable[[], bool]) -> None:
        self.server = server
        self.enough = enough
        self.codes: Counter[int] = Counter()
        self.errors: list[str] = []
        self.peak = 0.0
        self._done = threading.Event()
        self._stop = threading.Event()

    @property
    def leaks(self) -> int:
        """The calls to the leaking model (every other call of each client)."""
        return sum(self.codes.values()) // 2

    def _calls(self) -> Iterator[int]:
        call = 0
        while call < CALLS or not self._stop.is_set():
            yield call
            call += 1

    def _client(self) -> None:
        with httpx.Client(base_url=self.server.url, timeout=60) as client:
            for call in self._calls():
                model, body = ("leak", two_columns(1, 2)) if call % 2 else ("iris-logreg", IRIS)
                response = client.post(f"/v2/models/{model}/infer", json=body)
                self.codes[response.status_code] += 1
                if response.status_code != 200:
                    self.errors.append(response.text)

    def _grpc_client(self) -> None:
        """The same over gRPC (a status other than OK counts as its HTTP equivalent)."""
        leak = infer_request("leak", x=np.array([[1.0, 2.0]]))
        iris = infer_request("iris-logreg", x=np.array([[5.0, 3.0, 1.0, 0.0]]))
        with stub_for(self.server) as stub:
            for call in self._calls():
                try:
                    stub.ModelInfer(leak if call % 2 else iris, timeout=60)
                except grpc.RpcError as exc:
                    self.codes[500] += 1
                    self.errors.append(f"{exc.code()}: {exc.details()}")
                else:
                    self.codes[200] += 1

    def _watch(self) -> None:
        while not self._done.is_set():
            held = workers_private_mib(self.server.process.pid).values()
            self.peak = max(self.peak, *held, 0.0)
            time.sleep(0.1)

    def run(self) -> None:
        watcher = threading.Thread(target=self._watch)
        watcher.start()
        clients = [threading.Thread(target=self._client) for _ in range(CLIENTS - 1)]
        clients.append(threading.Thread(target=self._grpc_client))
        for client in clients:
            client.start()
        deadline = time.monotonic() + RECYCLES_WITHIN
        while not self.enough() and time.monotonic() < deadline:
            time.sleep(0.5)
        self._stop.set()
        for client in clients:
            client.join()
        self._done.set()
        watcher.join()


def serve(root: Path, leak_mb: int, *args: str) -> Server:
    build_iris_repository(root)
    write_leak(root, "leak", leak_mb)
    return Server(root, "--workers", "2", "--worker-memory-limit", "1024", *args)


def metrics_url(server: Server) -> str:
    return f"http://127.0.0.1:{server.metrics_port}/metrics"


# reason, MiB leaked per call, the setting, its log line, and the recycles the load runs
# until (at least 1,200 requests).
CASES = [
    # Two workers of 150-165 requests each: a worker leaks ~83 MiB before it goes (and what
    # it is sent while its replacement starts and loads).
    pytest.param(
        "max_requests", 1, ("--worker-max-requests", "150"),
        r"was sent \d+ requests \(--worker-max-requests 150\)", 4, id="max-requests",
    ),
    # Read every quarter second, and serving while its replacement starts and loads: a
    # worker overshoots the limit by what it leaks meanwhile.
    pytest.param(
        "max_rss", 2, ("--worker-max-rss", "160"),
        r"holds \d+ MiB of private memory \(--worker-max-rss 160 MiB\)", 3, id="max-rss",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("reason", "leak_mb", "args", "logged", "fewest"), CASES)
def test_a_leaking_model_is_recycled_under_load_with_no_failed_request(
    tmp_path: Path, reason: str, leak_mb: int, args: tuple[str, ...], logged: str, fewest: int
) -> None:
    with serve(tmp_path, leak_mb, *args) as server:
        server.wait_ready(120)
        fresh = max(workers_private_mib(server.process.pid).values())
        assert fresh < 100, fresh  # room to leak before the limits
        load = Load(server, lambda: recycles(metrics_url(server)).get(reason, 0) >= fewest)
        load.run()
        assert set(load.codes) == {200}, (load.codes, load.errors[:3])
        counted = recycles(metrics_url(server))
        # Without recycling, one of the two workers would hold at least half of what the
        # run leaked; with it, none came near that.
        unrecycled = load.leaks * leak_mb / 2
        print(f"{reason}: fresh {fresh:.0f} MiB, peak {load.peak:.0f} MiB, {load.leaks} "
              f"leaking calls ({unrecycled:.0f} MiB held unrecycled), {counted}")  # fmt: skip
        assert counted.pop(reason) >= fewest, counted
        assert set(counted.values()) == {0}, counted  # the other reasons
        server.expect_lines([logged])
        assert load.peak - fresh < 0.75 * unrecycled, (fresh, load.peak, load.leaks)
        wait_for(lambda: len(workers_private_mib(server.process.pid)) == 2, what="drained")
        assert server.stop() == 0
