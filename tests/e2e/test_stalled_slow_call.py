"""A slow call (not a hung one): its worker counts as stalled past ``--stall-threshold``, a
standby worker serves the other model meanwhile, and when the call ends the worker takes
requests again and the standby worker retires (engine/pool/stalls.py). The short variant of
``test_stalled_workers.py`` (slow env): nothing waits for a model timeout here."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support import Server, build_iris_repository
from tests.support.pool import calls, sum_request, wait_for, write_counting_model
from tests.support.stalls import Probe, metric, tree_memory

pytestmark = pytest.mark.timeout(180)


def test_a_slow_call_stalls_its_worker_until_it_ends(tmp_path: Path) -> None:
    build_iris_repository(tmp_path)
    calls_file = tmp_path / "calls.txt"
    write_counting_model(tmp_path, "slow", calls_file, delay=4)
    args = ("--workers", "1", "--stall-threshold", "0.5")
    with Server(tmp_path, *args) as server:
        server.wait_ready()
        probe = Probe(server, "iris-logreg", "rest").start()
        answers: list[int] = []
        url = f"{server.url}/v2/models/slow/infer"

        def ask_slow() -> None:
            reply = httpx.post(url, json=sum_request([[1, 2, 3]], "s"), timeout=60)
            answers.append(reply.status_code)

        slow = threading.Thread(target=ask_slow)
        slow.start()
        wait_for(lambda: tree_memory(server.process.pid)[0] == 4, 10, "a standby worker")
        slow.join(30)
        assert answers == [200]  # the slow call ended on its own worker, answered
        # The worker takes requests again, and the standby worker retires.
        wait_for(lambda: tree_memory(server.process.pid)[0] == 3, 20, "the pool's size")
        time.sleep(0.5)
        probe.stop()
        assert probe.statuses() == {"200"}
        assert probe.slowest() < 3.5, probe.slowest()  # never the whole 4 s call
        [(pid, _)] = calls(calls_file)
        log = server.expect_lines([
            rf"worker 0 \(pid {pid}\) has run one call of model 'slow'",
            rf"worker 0 \(pid {pid}\) ended its long call after",
            r"standby worker 0 \(pid \d+\) started while workers \[0\] are stalled; it "
            r"serves model 'iris-logreg', model 'iris-rf'",
            r"standby worker 0 \(pid \d+\) retires",
            r"retiring standby worker 0 \(pid \d+\) has drained and exited",
        ])  # fmt: skip
        assert "was recycled" not in log  # a slow call is not killed
        page = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
        assert metric(page, "inferpool_worker_stalls_total") == 1
        assert metric(page, "inferpool_standby_workers_started_total") == 1
        assert metric(page, "inferpool_worker_timeout_kills_total") == 0
