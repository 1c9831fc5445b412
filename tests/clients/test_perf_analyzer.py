"""Triton's perf_analyzer drives inferpool over HTTP and gRPC: it reads the model's
configuration and statistics, sends its own requests and completes without an error.

perf_analyzer is installed by scripts/install_perf_analyzer.sh (CI runs it); the test
finds it as the benchmark harness does (INFERPOOL_PERF_ANALYZER, build/perf_analyzer/, PATH)
and fails when it is missing.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.loadgen import perf_analyzer
from tests.support import Server, build_iris_repository

MODEL = "iris-logreg"


@pytest.fixture(scope="module")
def binary() -> str:
    found = perf_analyzer.find_binary()
    assert found is not None, f"perf_analyzer is not installed: {perf_analyzer.INSTALL_HINT}"
    return found


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_iris_repository(tmp_path_factory.mktemp("perf-analyzer"))
    # perf_analyzer reads versions as numbers (Triton's): give the model one.
    settings = {"name": MODEL, "parameters": {"version": "1"}}
    (root / MODEL / "model-settings.json").write_text(json.dumps(settings))
    return root


@pytest.fixture(
    scope="module",
    params=[("2", "builtin"), ("0", "grpcio")],
    ids=["workers2-builtin", "workers0-grpcio"],
)
def server(repository: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    workers, grpc = request.param
    with Server(repository, "--workers", workers, "--grpc-implementation", grpc) as running:
        running.wait_ready()
        yield running


def inference_count(server: Server) -> int:
    stats = httpx.get(f"{server.url}/v2/models/{MODEL}/stats").json()["model_stats"][0]
    return stats["inference_count"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("batch", [1, 8])
def test_perf_analyzer_completes(binary: str, server: Server, protocol: str, batch: int) -> None:
    url = server.grpc_address if protocol == "grpc" else f"127.0.0.1:{server.http_port}"
    before = inference_count(server)
    version = perf_analyzer.numbered_version(server.url, MODEL)
    cmd = perf_analyzer.command(binary, MODEL, version, url, protocol, batch, 2, 1.5)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "error" not in (done.stdout + done.stderr).lower()
    result = perf_analyzer.parse(done.stdout, batch)
    assert result.requests > 0
    assert result.rps > 0
    # The server counted perf_analyzer's rows: every request held ``batch`` of them.
    counted = inference_count(server) - before
    assert counted >= result.requests * batch
    assert counted % batch == 0


def test_a_model_without_a_numbered_version_is_refused_clearly(server: Server) -> None:
    with pytest.raises(ValueError, match="numbered version of model 'iris-rf'"):
        perf_analyzer.numbered_version(server.url, "iris-rf")
