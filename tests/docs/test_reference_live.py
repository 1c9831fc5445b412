"""The generated reference against a live server: every metric family a server with
workers exposes on /metrics, and every route it answers, is on its reference page."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from scripts.docs_reference import PAGES
from tests.support import Server, build_iris_repository
from tests.support.code_blocks import served


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = build_iris_repository(tmp_path_factory.mktemp("iris"))
    with served(repository, "--workers", "1") as running:
        yield running


def exposed_families(text: str) -> set[str]:
    """The family names of a Prometheus text exposition (its TYPE lines)."""
    return set(re.findall(r"^# TYPE (\S+) ", text, flags=re.M))


def test_every_exposed_metric_family_is_on_the_metrics_page(server: Server) -> None:
    httpx.post(
        f"{server.url}/v2/models/iris-rf/infer",
        json={"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [1, 2, 3, 4]}]},
        timeout=30,
    )
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30).text
    # A counter's TYPE line names it with or without _total, by prometheus_client's version.
    families = {
        name.removesuffix("_total")
        for name in exposed_families(text)
        if name.startswith("inferpool_")
    }
    assert "inferpool_worker_restarts" in families  # a pool's families are there
    page = PAGES["reference/metrics.md"]()
    missing = [f for f in sorted(families) if f"`{f}`" not in page and f"`{f}_total`" not in page]
    assert missing == []


def test_every_documented_get_route_without_parameters_answers(server: Server) -> None:
    page = PAGES["reference/endpoints.md"]()
    rows = re.findall(r"^\| `(/v2[^`{]*)` \| GET[^|]*\|(.*)$", page, flags=re.M)
    assert "/v2/health/ready" in [path for path, _ in rows]
    for path, says in rows:
        # A route documented as refused (CUDA shared memory) answers what it says.
        expected = 400 if "not supported (400)" in says else 200
        assert httpx.get(server.url + path, timeout=30).status_code == expected, path
