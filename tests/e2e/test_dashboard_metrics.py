"""Every metric the alert rules (deploy/prometheus/alerts.yml) and the Grafana dashboard
(deploy/grafana/inferpool.json) query is on a live server's /metrics, after a few REST and
gRPC requests (good and bad), with --workers 2 (the builtin gRPC server) and --workers 0
(grpcio): the queries are parsed with promql-parser, and each metric they name must be
served under that name, with the labels they filter and group by; rate() and increase()
only over counters. With --workers 0 only the worker pool's metrics may be absent."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import numpy as np
import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.queries import alert_queries, dashboard_queries, load_alerts, load_dashboard
from tests.support import Server
from tests.support.grpc import infer_request, stub_for

QUERIES = {
    **{f"alerts.yml {where}": expr for where, expr in alert_queries(load_alerts()).items()},
    **{f"inferpool.json {where}": e for where, e in dashboard_queries(load_dashboard()).items()},
}
# The worker pool's metrics: the per-worker ones (label `worker`) and the template's
# restarts have no meaning without workers, and are absent with --workers 0
# (docs/operate/metrics.md).
POOL_ONLY = {
    "inferpool_worker_restarts_total",
    "inferpool_worker_recycles_total",
    "inferpool_worker_heartbeat_age_seconds",
    "inferpool_worker_resident_memory_bytes",
    "inferpool_worker_proportional_memory_bytes",
    "inferpool_template_restarts_total",
}
# Labels Prometheus's scrape configuration adds to every series (deploy/prometheus/prometheus.yml).
TARGET_LABELS = {"instance", "job", "namespace", "pod"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
COUNTING = {"rate", "irate", "increase"}  # functions meaningful over counters only


@dataclass
class Scrape:
    """One /metrics answer: the type of each family, and the label names of each series
    name (a family declared with no series yet has a type and no labels)."""

    types: dict[str, str] = field(default_factory=dict)
    labels: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        scrape = cls()
        for family in text_string_to_metric_families(text):
            scrape.types[family.name] = family.type
            for sample in family.samples:
                scrape.labels.setdefault(sample.name, set()).update(sample.labels)
        return scrape

    def type_of(self, name: str) -> str | None:
        """The type of the family serving the series ``name``: a counter's or histogram's
        name carries its suffix; a gauge's is the family's."""
        if self.types.get(name) in ("gauge", "unknown"):
            return self.types[name]
        for kind, suffixes in SUFFIXES.items():
            for suffix in suffixes:
                if name.endswith(suffix) and self.types.get(name.removesuffix(suffix)) == kind:
                    return kind
        return None


def selectors(node: object) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(node, visit)
    return found


def metric_names(expr: str) -> set[str]:
    return {selector.name for selector in selectors(promql_parser.parse(expr))}


def check_query(expr: str, scrape: Scrape) -> list[str]:
    """What in ``expr`` does not fit the metrics ``scrape`` serves: label matchers and
    ``by`` labels the metric does not have, counting functions over a non-counter."""
    problems = []

    def labels_of(nodes: list[promql_parser.VectorSelector]) -> set[str] | None:
        """The labels the series of ``nodes`` carry; None when one has no series yet."""
        found = set(TARGET_LABELS)
        for node in nodes:
            if node.name not in scrape.labels:
                return None
            found |= scrape.labels[node.name]
        return found

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            wanted = {m.name for m in node.matchers.matchers}
            have = labels_of([node])
            if have is not None and not wanted <= have:
                problems.append(f"{node.name} has no label {sorted(wanted - have)}")
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            if node.modifier.type == promql_parser.AggModifierType.By:
                have = labels_of(selectors(node.expr))
                if have is not None and not set(node.modifier.labels) <= have:
                    missing = sorted(set(node.modifier.labels) - have)
                    problems.append(f"`{node.prettify()}` groups by absent {missing}")
        elif isinstance(node, promql_parser.Call) and node.func.name in COUNTING:
            for selector in selectors(node):
                if scrape.type_of(selector.name) in ("gauge", "unknown"):
                    problems.append(f"{node.func.name}() over {selector.name}, no counter")

    promql_parser.walk(promql_parser.parse(expr), visit)
    return problems


@pytest.fixture(scope="module", params=[(2, "builtin"), (0, "grpcio")], ids=["w2", "w0"])
def scrape(request: pytest.FixtureRequest, iris_repo: Path) -> Iterator[tuple[int, Scrape]]:
    """(workers, the server's /metrics) after good and bad requests over REST and gRPC."""
    workers, implementation = request.param
    flags = ("--workers", str(workers), "--grpc-implementation", implementation)
    with Server(iris_repo, *flags) as server:
        server.wait_ready()
        drive(server)
        text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
        yield workers, Scrape.parse(text)


def drive(server: Server) -> None:
    rows = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]])
    body = {
        "inputs": [
            {"name": "x", "shape": [2, 4], "datatype": "FP64", "data": rows.ravel().tolist()}
        ]
    }
    with httpx.Client(base_url=server.url) as client:
        for model in ("iris-logreg", "iris-rf"):
            for _ in range(3):
                assert client.post(f"/v2/models/{model}/infer", json=body).status_code == 200
        bad = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP64", "data": [1] * 6}]}
        assert client.post("/v2/models/iris-rf/infer", json=bad).status_code != 200
    with stub_for(server) as stub:
        for _ in range(3):
            stub.ModelInfer(infer_request("iris-logreg", x=rows))
        with pytest.raises(grpc.RpcError):
            stub.ModelInfer(infer_request("iris-logreg", x=rows[:, :3]))


def test_every_query_parses_and_names_inferpool_metrics() -> None:
    assert len(QUERIES) > 20
    for where, expr in QUERIES.items():
        names = metric_names(expr)
        assert names, where
        assert all(name and name.startswith("inferpool_") for name in names), where


def test_every_metric_the_queries_name_is_served(scrape: tuple[int, Scrape]) -> None:
    workers, served = scrape
    missing = {
        name: where
        for where, expr in QUERIES.items()
        for name in metric_names(expr)
        if served.type_of(name) is None
    }
    if workers == 0:
        for name in POOL_ONLY:
            missing.pop(name, None)
    assert missing == {}, f"not on /metrics with --workers {workers}: {sorted(missing)}"


def test_the_queries_fit_the_metrics_they_name(scrape: tuple[int, Scrape]) -> None:
    _, served = scrape
    problems = {
        where: found for where, expr in QUERIES.items() if (found := check_query(expr, served))
    }
    assert problems == {}


def test_a_query_that_does_not_fit_is_caught(scrape: tuple[int, Scrape]) -> None:
    _, served = scrape
    assert check_query('rate(inferpool_model_ready{model="a"}[5m])', served) == [
        "rate() over inferpool_model_ready, no counter"
    ]
    assert check_query('inferpool_model_ready{modell="a"}', served) == [
        "inferpool_model_ready has no label ['modell']"
    ]
    assert check_query("sum by (stage) (inferpool_model_ready)", served) == [
        "`sum by (stage) (inferpool_model_ready)` groups by absent ['stage']"
    ]
    assert served.type_of("inferpool_model_ready_count") is None
    assert served.type_of("inferpool_model_ready") == "gauge"
