"""The benchmark harness's peers for real: the KServe peer (benchmarks/kserve_peer.py) on
kserve's own ModelServer answers every scenario's bytes rightly and serves no model
configuration (so perf_analyzer cells on it are "n/a"), and a perf_analyzer run of the
harness measures inferpool.

tox's ``clients`` environment holds kserve and the model libraries beside inferpool, so the
peer runs on this interpreter (``INFERPOOL_KSERVE_PYTHON``): nothing is installed. Another
python may be named in that variable (e.g. ``benchmarks/.venv-kserve/bin/python``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import kserve_env
from benchmarks.check import check
from benchmarks.loadgen import perf_analyzer
from benchmarks.models import build_repository
from benchmarks.runner import build_payloads
from benchmarks.scenarios import Scenario
from benchmarks.servers import ServerSpec, start

PROJECT_ROOT = Path(__file__).resolve().parents[2]
KSERVE_PYTHON = os.environ.get(kserve_env.OVERRIDE) or sys.executable
PROTOCOLS = ("rest-json", "rest-binary", "grpc-typed", "grpc-raw")


@pytest.fixture(scope="module")
def kserve_python() -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(kserve_env.OVERRIDE, KSERVE_PYTHON)
        yield kserve_env.ensure()  # probed once: it imports kserve and three libraries


def test_the_kserve_peer_answers_every_protocol_rightly(tmp_path: Path, kserve_python: Path):
    models = ["iris", "lightgbm"]
    repo = build_repository(tmp_path / "repo", models)
    scenarios = tuple(Scenario(m, b, p, 1) for m in models for b in (1, 256) for p in PROTOCOLS)
    payloads = build_payloads(repo, scenarios)
    server = start(ServerSpec.parse("kserve-w1"), repo, models, tmp_path, kserve=kserve_python)
    try:
        for key, payload in payloads.items():
            assert check(server, payload) > 0, key  # right predictions, else CheckFailed
        reason = perf_analyzer.config_missing(server.http_base, "iris")
        assert reason.startswith("no model configuration (GET /v2/models/iris/config: HTTP 404)")
    finally:
        server.stop()
    assert server.process is not None and server.process.returncode is not None


def test_a_perf_analyzer_run_measures_inferpools_binary_scenarios(tmp_path: Path):
    assert perf_analyzer.find_binary(), f"perf_analyzer is missing: {perf_analyzer.INSTALL_HINT}"
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "benchmarks", "run", "--profile", "full",
        "--generator", "perf_analyzer", "--servers", "inferpool-w1",
        "--only", "iris/b1/rest-json/c1", "--only", "iris/b1/grpc-raw/c1",
        "--only", "iris/b1/rest-binary/c1",
        "--duration", "1", "--warmup", "0", "--repetitions", "1",
        "--out", str(out), "--repo", str(tmp_path / "repo"),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cells = {
        (c["scenario"], c["server"]): c
        for c in json.loads((out / "results.json").read_text())["summary"]
    }
    assert len(cells) == 3
    for protocol in ("rest-binary", "grpc-raw"):
        measured = cells[(f"iris/b1/{protocol}/c1", "inferpool-w1")]
        assert measured["status"] == "ok", measured
        assert measured["generator"] == "perf_analyzer"
        assert measured["errors"] == 0 and measured["requests"] > 0, measured
    # perf_analyzer cannot send JSON bodies: that cell is skipped, not mislabelled.
    skipped = cells[("iris/b1/rest-json/c1", "inferpool-w1")]
    assert (skipped["status"], skipped["reason"]) == ("n/a", perf_analyzer.PROTOCOL_REASON)
