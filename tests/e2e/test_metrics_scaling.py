"""The autoscaling gauges on /metrics under load: ``inferpool_model_in_flight_requests``
(accepted, not yet answered) and ``inferpool_model_queued_requests`` (not yet picked by a
worker), scraped while slow requests run, with workers and without."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import Server
from tests.support.runtimes import write_echo_model

IN_FLIGHT = "inferpool_model_in_flight_requests"
QUEUED = "inferpool_model_queued_requests"


def slow_model(root: Path, name: str, **settings: object) -> None:
    """An echo model whose input ``sleep`` makes each predict sleep that many seconds."""
    folder = write_echo_model(root, name)
    path = folder / "model-settings.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))


def sleep_request(seconds: float) -> dict:
    return {"inputs": [{"name": "sleep", "shape": [1], "datatype": "FP32", "data": [seconds]}]}


async def gauges(client: httpx.AsyncClient, server: Server, model: str) -> tuple[float, float]:
    """(in flight, queued) of ``model`` as one scrape reports them."""
    text = (await client.get(f"http://127.0.0.1:{server.metrics_port}/metrics")).text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (IN_FLIGHT, QUEUED) and sample.labels["model"] == model:
                assert sample.labels["version"] == ""
                found[sample.name] = sample.value
    return found[IN_FLIGHT], found[QUEUED]


async def load_and_scrape(
    server: Server, model: str, requests: int, seconds: float
) -> list[tuple[float, float]]:
    """Send ``requests`` slow requests at once; scrape the gauges until all are answered.
    Every scrape's (in flight, queued), the last one taken after the load."""
    url = f"{server.url}/v2/models/{model}/infer"
    async with httpx.AsyncClient(timeout=60) as client:
        assert await gauges(client, server, model) == (0, 0)
        body = sleep_request(seconds)
        load = [asyncio.ensure_future(client.post(url, json=body)) for _ in range(requests)]
        seen = []
        while not all(task.done() for task in load):
            seen.append(await gauges(client, server, model))
            await asyncio.sleep(0.05)
        assert [(await task).status_code for task in load] == [200] * requests
        seen.append(await gauges(client, server, model))
    return seen


def check_consistent(seen: list[tuple[float, float]], requests: int) -> None:
    for in_flight, queued in seen:
        assert 0 <= queued <= in_flight <= requests
    assert seen[-1] == (0, 0)  # after the load


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two workers: ``slow`` has a replica on each, ``batched`` one replica batching four
    requests at a time."""
    root = tmp_path_factory.mktemp("scaling-repo")
    slow_model(root, "slow")
    slow_model(root, "batched", replicas=1, max_batch_size=4, max_batch_time=2.0)
    with Server(root, "--workers", "2") as server:
        server.wait_ready()
        yield server


def queue_waits(server: Server, model: str) -> tuple[float, float]:
    """(requests, those that waited more than a second) in the model's queue histogram."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("model") == model and labels.get("stage") == "queue":
                found[(sample.name, labels.get("le"))] = sample.value
    name = "inferpool_model_stage_duration_seconds"
    count = found[(f"{name}_count", None)]
    return count, count - found[(f"{name}_bucket", "1.0")]


def test_queued_beyond_the_replicas_with_two_workers(pool):
    # Six requests, one replica per worker: two run, four wait in the workers' queues.
    before = queue_waits(pool, "slow")
    seen = asyncio.run(load_and_scrape(pool, "slow", 6, 1.5))
    check_consistent(seen, 6)
    assert (6, 4) in seen, seen
    # As the queue empties: two answered, two running, two still waiting.
    assert (4, 2) in seen, seen
    # The queue stage's histogram saw it: the four queued waited 1.5 s or 3 s each.
    after = queue_waits(pool, "slow")
    assert after[0] - before[0] == 6
    assert after[1] - before[1] >= 4


def test_a_running_batch_counts_each_request_it_holds(pool):
    # Eight requests to the one batching replica are two groups of four: while the first
    # runs, the other four wait (in the worker's ring).
    seen = asyncio.run(load_and_scrape(pool, "batched", 8, 0.4))
    check_consistent(seen, 8)
    assert (8, 4) in seen, seen


def test_the_autoscaling_manifests_and_doc_name_exported_metrics(pool):
    # What an HPA, KEDA or the doc asks Prometheus for is what the server exports.
    root = Path(__file__).resolve().parents[2]
    files = [
        root / "deploy/kserve/hpa.yaml",
        root / "deploy/kserve/keda-scaledobject.yaml",
        root / "deploy/kserve/prometheus-adapter-rules.yaml",
        root / "docs/deploy/autoscaling.md",
    ]
    named = set()
    for path in files:
        named |= set(re.findall(r"\binferpool_[a-z_]*[a-z]\b", path.read_text()))
    text = httpx.get(f"http://127.0.0.1:{pool.metrics_port}/metrics").text
    exported = {family.name for family in text_string_to_metric_families(text)}
    assert {IN_FLIGHT, QUEUED} <= named
    assert named <= exported, named - exported


def test_in_process_on_the_loop_nothing_waits(tmp_path):
    # --workers 0 --stall-threshold 0: a request runs on the event loop from acceptance to
    # answer, so the scrape (served by that loop) finds none in flight and none queued,
    # under load too.
    slow_model(tmp_path, "slow")
    with Server(tmp_path, "--workers", "0", "--stall-threshold", "0") as server:
        server.wait_ready()
        started = time.monotonic()
        seen = asyncio.run(load_and_scrape(server, "slow", 4, 0.3))
    assert time.monotonic() - started >= 4 * 0.3  # the four ran one after another
    assert set(seen) == {(0, 0)}
    assert len(seen) > 1


def test_in_process_one_predict_runs_in_a_thread_and_the_rest_wait(tmp_path):
    # --workers 0: predicts run in threads while the loop answers scrapes, one at a time
    # per model version: four requests at once, one runs, three wait.
    slow_model(tmp_path, "slow")
    with Server(tmp_path, "--workers", "0") as server:
        server.wait_ready()
        started = time.monotonic()
        seen = asyncio.run(load_and_scrape(server, "slow", 4, 0.5))
    assert time.monotonic() - started >= 4 * 0.5  # the four ran one after another
    check_consistent(seen, 4)
    assert (4, 3) in seen, seen
