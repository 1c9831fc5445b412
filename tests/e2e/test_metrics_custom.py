"""Custom metrics a runtime defines (``self.metrics``, ``mlserver.register``/``log``) reach
/metrics with the model's labels, summed across workers, over REST and gRPC; they survive a
reload and a worker's death; bad definitions fail the model's load with the reason."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferpool.engine.worker.metrics_reporter import REPORT_INTERVAL_NS
from tests.support import Server, write_custom_model
from tests.support.grpc import infer_request, needs_pool, running_server, stub_for
from tests.support.pool import wait_for

COUNTING = """
    import os
    import time

    import numpy as np

    from inferpool import Runtime


    class Counting(Runtime):
        def load(self):
            self.predictions = self.metrics.counter(
                "demo_predictions", "Requests predicted", labels=["rows"]
            )
            self.by_worker = self.metrics.counter("demo_worker_predictions", "", ["pid"])
            self.sums = self.metrics.histogram(
                "demo_input_sum", "Sum of a request's input", buckets=[1, 10, 100]
            )
            self.metrics.gauge("demo_replicas", "Replicas loaded").set(1)
            self.metrics.gauge("demo_threshold", "Threshold", aggregate="max").set(7)
            self.last = self.metrics.gauge("demo_last_sum", "Last input sum", aggregate="last")

        def predict(self, payload, outputs):
            time.sleep(0.005)  # concurrent requests overlap: both workers get some
            self.predictions.labels(rows=len(payload)).inc()
            self.by_worker.labels(pid=os.getpid()).inc()
            self.sums.observe(float(np.sum(payload)))
            self.last.set(float(np.sum(payload)))
            return {outputs[0]: np.sum(payload, axis=1)}
"""

MLSERVER_STYLE = """
    import inferpool.mlserver as mlserver
    from inferpool.mlserver import MLModel
    from inferpool.mlserver.types import InferenceResponse, ResponseOutput


    class Logging(MLModel):
        async def load(self):
            mlserver.register("demo_mlserver_rows", "Rows per request")
            return True

        async def predict(self, payload):
            mlserver.log(demo_mlserver_rows=payload.inputs[0].shape[0], demo_mlserver_other=0.5)
            output = ResponseOutput(name="y", datatype="FP64", shape=[1], data=[1.0])
            return InferenceResponse(model_name=self.name, outputs=[output])
"""

DOC = Path(__file__).resolve().parents[2] / "docs" / "operate" / "custom-metrics.md"

BAD_DEFINITIONS = {
    "reserved": (
        'self.metrics.counter("inferpool_hits", "")',
        "custom metric 'inferpool_hits': names starting with 'inferpool_' are inferpool's own",
    ),
    "invalid": (
        'self.metrics.gauge("bad-name", "")',
        "custom metric 'bad-name': not a valid Prometheus metric name",
    ),
    "label": (
        'self.metrics.histogram("demo_h", "", labels=["model"])',
        "custom metric 'demo_h': the label 'model' is reserved",
    ),
    "shared": (
        'self.metrics.gauge("demo_predictions", "")',
        "custom metric 'demo_predictions': model 'counting' defines it as a counter",
    ),
    "retyped": (
        'self.metrics.counter("demo_x", ""); self.metrics.gauge("demo_x", "")',
        "custom metric 'demo_x': it is already defined with another type",
    ),
}

SETTINGS = {
    "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 2]}],
    "outputs": [{"name": "sum", "datatype": "FP64", "shape": [-1]}],
}
LABELS = {"model": "counting", "version": ""}
REQUESTS = 24  # half over REST, half over gRPC


def repository(root: Path) -> Path:
    write_custom_model(root / "counting", COUNTING, "Counting", **SETTINGS)
    write_custom_model(root / "mlstyle", MLSERVER_STYLE, "Logging", module="mlstyle_model")
    return root


@pytest.fixture(
    scope="module",
    params=[
        pytest.param((0, "builtin"), id="builtin-w0"),
        pytest.param((2, "grpcio"), id="grpcio-w2", marks=needs_pool),
    ],
)
def server(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Server]:
    workers, implementation = request.param
    root = repository(tmp_path_factory.mktemp("custom-metrics"))
    with running_server(root, workers, implementation=implementation) as running:
        running.repository = root
        running.workers = workers
        yield running


def scrape(server: Server) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset({**LABELS, **labels}.items())))


def settled(server: Server, name: str, expected: float, **labels: str) -> dict:
    """The scrape once ``name`` reads ``expected`` (workers report at most once a second)."""
    found: list[dict] = [{}]

    def reached() -> bool:
        found[0] = scrape(server)
        return value(found[0], name, **labels) == expected

    try:
        wait_for(reached, 10, f"{name} == {expected}")
    except TimeoutError:
        raise AssertionError(f"{name}: {value(found[0], name, **labels)} != {expected}") from None
    return found[0]


def predict(server: Server, index: int) -> None:
    if index % 2:
        body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [1, 2]}]}
        response = httpx.post(f"{server.url}/v2/models/counting/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
    else:
        with stub_for(server) as stub:
            stub.ModelInfer(infer_request("counting", x=np.array([[1.0, 2.0]])), timeout=30)


def predictions(server: Server) -> float:
    return value(scrape(server), "demo_predictions_total", rows="1") or 0.0


def quiet_predictions(server: Server) -> float:
    """``predictions`` once every worker has reported: two scrapes a report interval apart
    agree. Read at once, a worker's count of an earlier test's requests may still be on its
    way (each reports at most once a second), and arrive as if it were this test's."""
    interval = REPORT_INTERVAL_NS / 1e9 * 1.2
    deadline = time.monotonic() + 10
    last = predictions(server)
    while time.monotonic() < deadline:
        time.sleep(interval)
        now, last = last, predictions(server)
        if now == last:
            return last
    raise AssertionError(f"demo_predictions_total never settled (last {last})")


def test_counts_from_every_worker_are_summed(server: Server) -> None:
    before = predictions(server)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda index: predict(server, index), range(REQUESTS)))
    samples = settled(server, "demo_predictions_total", before + REQUESTS, rows="1")
    count = value(samples, "demo_input_sum_count")
    assert count == before + REQUESTS
    assert value(samples, "demo_input_sum_sum") == 3 * count
    assert value(samples, "demo_input_sum_bucket", le="1.0") == 0
    assert value(samples, "demo_input_sum_bucket", le="10.0") == count
    assert value(samples, "demo_input_sum_bucket", le="+Inf") == count
    pids = {
        dict(labels)["pid"]
        for name, labels in samples
        if name == "demo_worker_predictions_total" and dict(labels)["model"] == "counting"
    }
    assert len(pids) == max(1, server.workers)  # the requests were spread over the workers


def test_gauges_set_in_load_are_summed_or_their_max(server: Server) -> None:
    samples = settled(server, "demo_replicas", max(1, server.workers))
    assert value(samples, "demo_threshold") == 7  # aggregate="max": not 7 per worker


def test_the_last_gauge_set_in_any_worker_wins(server: Server) -> None:
    with ThreadPoolExecutor(4) as pool:  # both workers set it to 3 (1 + 2)
        list(pool.map(lambda index: predict(server, index), range(8)))
    settled(server, "demo_last_sum", 3)
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [0, 1]}]}
    response = httpx.post(f"{server.url}/v2/models/counting/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    settled(server, "demo_last_sum", 1)  # not their sum (4) nor their max (3)


def test_a_reload_keeps_the_counts_and_replaces_the_gauges(server: Server) -> None:
    before = quiet_predictions(server)
    predict(server, 1)
    settled(server, "demo_predictions_total", before + 1, rows="1")
    reply = httpx.post(f"{server.url}/v2/repository/models/counting/load", timeout=60)
    assert reply.status_code == 200, reply.text
    predict(server, 1)
    settled(server, "demo_predictions_total", before + 2, rows="1")
    # The old replicas' unloads are reported as the new ones' loads: within a second.
    settled(server, "demo_replicas", max(1, server.workers))


@needs_pool
def test_a_dead_workers_counts_are_kept(server: Server) -> None:
    if not server.workers:
        pytest.skip("no worker to kill with --workers 0")
    before = quiet_predictions(server)
    predict(server, 1)
    settled(server, "demo_predictions_total", before + 1, rows="1")
    (template,) = psutil.Process(server.process.pid).children()
    victim = template.children()[0].pid
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: victim not in [w.pid for w in template.children()], 10, "the kill")
    predict(server, 1)
    samples = settled(server, "demo_predictions_total", before + 2, rows="1")
    assert value(samples, "demo_input_sum_count") == before + 2


def test_mlserver_register_and_log_are_histograms_of_the_model(server: Server) -> None:
    labels = {"model": "mlstyle"}
    before = value(scrape(server), "demo_mlserver_rows_count", **labels) or 0
    body = {"inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP64", "data": [1, 2, 3]}]}
    for _ in range(3):
        response = httpx.post(f"{server.url}/v2/models/mlstyle/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
    samples = settled(server, "demo_mlserver_rows_count", before + 3, **labels)
    assert value(samples, "demo_mlserver_rows_sum", **labels) == 3 * (before + 3)
    assert value(samples, "demo_mlserver_other_count", **labels) == before + 3


def test_the_documented_example_gives_the_documented_metrics(server: Server) -> None:
    text = DOC.read_text()
    files = dict(
        re.findall(r"^`models/([^`]+)`:\n\n(?:<!--.*?-->\n)?```\w*\n(.*?)^```", text, re.M | re.S)
    )
    assert set(files) == {"scorer/scorer.py", "scorer/model-settings.json"}
    for path, body in files.items():
        (server.repository / path).parent.mkdir(exist_ok=True)
        (server.repository / path).write_text(body)
    reply = httpx.post(f"{server.url}/v2/repository/models/scorer/load", timeout=60)
    assert reply.status_code == 200, reply.text
    body = json.loads(re.search(r"-d '(\{.*?\})'", text).group(1))
    response = httpx.post(f"{server.url}/v2/models/scorer/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    shown = re.search(r"^```\n(scorer_.*?)^```", text, re.M | re.S).group(1)
    expected = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(shown)
        for sample in family.samples
    }
    found: dict = {}

    def shown_values() -> bool:
        found.update(scrape(server))
        return all(found.get(key) == number for key, number in expected.items())

    try:
        wait_for(shown_values, 10, "the documented values")
    except TimeoutError:
        raise AssertionError({key: found.get(key) for key in expected}) from None


@pytest.mark.parametrize("case", sorted(BAD_DEFINITIONS))
def test_a_bad_definition_fails_the_load_with_its_reason(server: Server, case: str) -> None:
    statement, reason = BAD_DEFINITIONS[case]
    source = f"""
        from inferpool import Runtime

        class Bad(Runtime):
            def load(self):
                {statement}

            def predict(self, payload, outputs):
                return payload
    """
    name = f"bad-{case}"
    write_custom_model(server.repository / name, source, "Bad", **SETTINGS)
    reply = httpx.post(f"{server.url}/v2/repository/models/{name}/load", timeout=60)
    assert reply.status_code != 200
    assert f"model '{name}': {reason}" in reply.json()["error"]
