"""What the slow-reader tests (``tests/e2e/test_slow_readers.py``) run and watch: a model
with large answers, the frontend's memory, other clients' latency, and readers started
together."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx

from benchmarks.slow_readers import MODEL
from tests.support import Server
from tests.support.probes import rss_mib

# ``big`` answers that many UINT8 zeros (two bytes each in JSON), or for a negative count
# that many FP64 zeros (eight bytes each in protobuf, quick to encode): the benchmark's.
BIG_RUNTIME = MODEL


def latency(server: Server) -> float:
    """Seconds a health check may take meanwhile, on a 2-core machine shared with other
    tests while two workers encode large answers. With ``--workers 0`` the model runs in
    the frontend's process, and encoding one 8.6 MiB answer holds its loop for a moment,
    whatever the bounds."""
    return 5.0 if server.workers else 8.0


def small_latency(server: Server) -> float:
    """Seconds a small model's inference may take meanwhile: it may also wait in a
    worker's queue behind large answers being encoded (issue 37's surge workers address
    that; the bounds here do not)."""
    return latency(server) + 5.0


class Memory:
    """The frontend's RSS, sampled every 20 ms in a thread: its baseline, its peak, and
    what it held once every answer was written or refused (``hold``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.baseline = rss_mib(pid)
        self.peak = self.baseline
        self.held = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mib(self.pid))

    def __enter__(self) -> Memory:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def hold(self, seconds: float = 0.3) -> None:
        """Sample what is held now, for ``seconds``: call it once the answers are out of
        the workers, so that what shows is what the frontend keeps for its readers (the
        peak also has the answers in flight: read from the workers, two copies each for
        a moment, and several at once when a loaded machine lets them pile up)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.held = max(self.held, rss_mib(self.pid))
            time.sleep(0.02)

    def assert_held_under(self, mib: float) -> None:
        assert self.held - self.baseline < mib, (self.baseline, self.held, self.peak)

    def assert_back(self, slack: float = 20, wait: float = 15) -> None:
        """RSS comes back within ``slack`` MiB of the baseline (a collection may be due)."""
        deadline = time.monotonic() + wait
        while rss_mib(self.pid) > self.baseline + slack and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rss_mib(self.pid) <= self.baseline + slack, (self.baseline, rss_mib(self.pid))


class SmallInferences:
    """Another client's small inferences (iris over REST), one every 50 ms in a thread:
    every one must answer 200, the slowest within ``limit`` seconds."""

    def __init__(self, server: Server, limit: float = 3.0) -> None:
        self.url = f"{server.url}/v2/models/iris-logreg/infer"
        self.limit = limit
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        tensor = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [5.1, 3.5, 1.4, 0.2]}
        with httpx.Client(timeout=15) as client:
            while not self._stop.wait(0.05):
                started = time.monotonic()
                try:
                    response = client.post(self.url, json={"inputs": [tensor]})
                    if response.status_code != 200:
                        self.failures.append(f"{response.status_code} {response.text}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.latencies.append(time.monotonic() - started)

    def __enter__(self) -> SmallInferences:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(20)
        if exc_info[0] is not None:
            return
        assert not self.failures, self.failures[:3]
        assert self.latencies, "no inference ran"
        assert max(self.latencies) < self.limit, f"an inference took {max(self.latencies):.2f}s"


Reader = Callable[[Callable[[], None]], tuple[str, str]]


def run_all(reader: Reader, count: int, memory: Memory) -> tuple[Counter[str], list[str]]:
    """Run ``count`` readers, each in a thread of its own, all at once; once every one has
    its answer's head (every answer is written or refused), what the frontend holds is
    sampled. How many ended how, and their messages."""
    outcomes: list[tuple[str, str]] = []
    heads = threading.Semaphore(0)
    threads = [
        threading.Thread(target=lambda: outcomes.append(reader(heads.release)))
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    for _ in range(count):
        assert heads.acquire(timeout=60), "a reader got no answer"
    memory.hold()
    for thread in threads:
        thread.join(120)
    assert len(outcomes) == count, "a reader did not finish"
    return Counter(outcome for outcome, _ in outcomes), [message for _, message in outcomes]
