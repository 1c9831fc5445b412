"""A real Prometheus (Debian's `prometheus` package, /usr/bin/prometheus; .ci/run installs it
with scripts/install_prometheus.sh) started on 127.0.0.1 with deploy/prometheus/alerts.yml,
scraping two live servers under load every second: --workers 2, and --workers 0 beside a
model that fails to load, which keeps that server not ready. The alert rules load and
evaluate without error, the not-ready alerts are pending for that server only, and
histogram_quantile over the request histogram gives each model under load a finite p99 on
both servers."""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
import numpy as np
import pytest
import yaml

from tests.deploy.queries import ALERTS, alert_queries, load_alerts
from tests.support import Server, free_port, wait_for_200
from tests.support.grpc import infer_request, stub_for

pytestmark = pytest.mark.slow

T = TypeVar("T")
PROMETHEUS = shutil.which("prometheus")
MODELS = ("iris-logreg", "iris-rf")
P99 = (
    "histogram_quantile(0.99, sum by (le, instance, model) "
    "(rate(inferpool_model_request_duration_seconds_bucket[10s])))"
)


@dataclass
class Setup:
    prometheus: str  # its base URL
    busy: dict[str, Server]  # instance label → a server whose iris models are under load
    not_ready: str  # the instance label of the one whose model "broken" failed to load


def instance(server: Server) -> str:
    return f"127.0.0.1:{server.metrics_port}"


def start_prometheus(
    folder: Path, targets: list[str], port: int, log: IO[bytes]
) -> subprocess.Popen[bytes]:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "inferpool", "static_configs": [{"targets": targets}]}],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    command = [
        str(PROMETHEUS),
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def setup(iris_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    if PROMETHEUS is None:
        pytest.skip(
            "no prometheus binary (apt-get install prometheus; scripts/install_prometheus.sh)"
        )
    folder = tmp_path_factory.mktemp("prometheus")
    with ExitStack() as stack:
        # Started together: their start-ups overlap.
        w2 = stack.enter_context(Server(iris_repo, "--workers", "2"))
        flags = ("--workers", "0", "--no-exit-on-error")
        w0 = stack.enter_context(Server(with_broken_model(iris_repo, folder), *flags))
        port = free_port()
        log = folder / "prometheus.log"
        targets = [instance(server) for server in (w2, w0)]
        process = start_prometheus(folder, targets, port, stack.enter_context(log.open("wb")))
        stack.callback(stop, process)
        url = f"http://127.0.0.1:{port}"
        w2.wait_ready()
        for model in MODELS:
            wait_for_200(f"{w0.url}/v2/models/{model}/ready", w0.process, w0.output, 60)
        wait_for_200(f"{url}/-/ready", process, lambda: log.read_text(errors="replace"), 30)
        yield Setup(url, {instance(w2): w2, instance(w0): w0}, instance(w0))


def with_broken_model(repository: Path, folder: Path) -> Path:
    """A copy of ``repository`` plus a model whose artefact is no pickle: it fails to load,
    so the server serves the others and stays not ready."""
    copy = shutil.copytree(repository, folder / "repository")
    (copy / "broken").mkdir()
    (copy / "broken" / "model.joblib").write_bytes(b"no pickle")
    return copy


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def api(setup: Setup, path: str, **params: str) -> Any:
    answer = httpx.get(f"{setup.prometheus}/api/v1/{path}", params=params, timeout=10)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "success", body
    return body["data"]


def wait_for(condition: Callable[[], T | None], timeout: float, what: str) -> T:
    """``condition()``'s first truthy value, polled every 0.5 s for ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s: {what}")


def alerting_rules(setup: Setup) -> dict[str, dict[str, Any]]:
    return {
        rule["name"]: rule
        for group in api(setup, "rules")["groups"]
        for rule in group["rules"]
        if rule["type"] == "alerting"
    }


def test_the_alert_rules_load_and_evaluate(setup: Setup) -> None:
    expected = {where.split("/")[1] for where in alert_queries(load_alerts())}

    def evaluated() -> dict[str, dict[str, Any]] | None:
        rules = alerting_rules(setup)
        return rules if all(r["health"] != "unknown" for r in rules.values()) else None

    rules = wait_for(evaluated, 15, "every rule evaluated once")
    assert set(rules) == expected
    assert {name: (r["health"], r.get("lastError", "")) for name, r in rules.items()} == {
        name: ("ok", "") for name in expected
    }


def test_the_not_ready_alerts_are_pending_for_the_server_that_is_not_ready(setup: Setup) -> None:
    def pending(alert: str) -> list[dict[str, Any]] | None:
        # The other one was not ready either while it loaded its models: wait for its
        # alert to go.
        alerts = alerting_rules(setup)[alert]["alerts"]
        instances = [alert["labels"]["instance"] for alert in alerts]
        return alerts if instances == [setup.not_ready] else None

    (server,) = wait_for(lambda: pending("InferpoolNotReady"), 15, "InferpoolNotReady")
    assert server["state"] == "pending"  # `for: 5m` has not passed
    assert server["labels"]["severity"] == "critical"
    (model,) = wait_for(lambda: pending("InferpoolModelNotReady"), 5, "InferpoolModelNotReady")
    assert model["state"] == "pending"
    assert (model["labels"]["model"], model["labels"]["severity"]) == ("broken", "warning")


def test_histogram_quantile_gives_a_p99_for_each_model_under_load(setup: Setup) -> None:
    done = threading.Event()
    errors: list[Exception] = []
    load = [threading.Thread(target=drive, args=(s, done, errors)) for s in setup.busy.values()]
    for thread in load:
        thread.start()
    try:

        def p99s() -> dict[tuple[str, str], float] | None:
            found = {
                (r["metric"]["instance"], r["metric"]["model"]): float(r["value"][1])
                for r in api(setup, "query", query=P99)["result"]
            }
            wanted = {(i, model) for i in setup.busy for model in MODELS}
            return found if wanted <= {k for k, v in found.items() if math.isfinite(v)} else None

        found = wait_for(p99s, 20, f"a finite {P99} for every model of both servers")
    finally:
        done.set()
        for thread in load:
            thread.join()
    assert errors == []
    for key in ((i, model) for i in setup.busy for model in MODELS):
        assert 0 < found[key] < 10, (key, found[key])


def drive(server: Server, done: threading.Event, errors: list[Exception]) -> None:
    """Requests to both models over REST and gRPC, one at a time, until ``done``; what
    went wrong into ``errors``."""
    rows = np.array([[5.1, 3.5, 1.4, 0.2]])
    body = {
        "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": rows[0].tolist()}]
    }
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client, stub_for(server) as stub:
            while not done.is_set():
                for model in MODELS:
                    answer = client.post(f"/v2/models/{model}/infer", json=body)
                    assert answer.status_code == 200, answer.text
                    stub.ModelInfer(infer_request(model, x=rows))
                time.sleep(0.01)
    except Exception as exc:  # reported by the test, in its own thread
        errors.append(exc)
