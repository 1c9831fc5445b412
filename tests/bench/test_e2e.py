"""End to end: ``python -m benchmarks run --quick`` against a real server for a few seconds.

The server is ``python -m SERVER_MODULE serve REPO ...``, exactly as the harness starts
inferpool. Until inferpool's server is merged this is the stand-in in this folder; after
the merge it is ``inferpool`` itself: change SERVER_MODULE, nothing else.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SERVER_MODULE = "inferpool"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
QUICK_SCENARIOS = 5


def run_quick(tmp_path: Path, generator: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks",
        "run",
        "--quick",
        "--servers",
        "inferpool-w0",
        "--generator",
        generator,
        "--duration",
        "2",
        "--warmup",
        "0.5",
        "--repetitions",
        "1",
        "--out",
        str(out),
        "--repo",
        str(tmp_path / "repo"),
        "--inferpool-module",
        SERVER_MODULE,
    ]
    done = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=240)
    results = json.loads((out / "results.json").read_text()) if done.returncode in (0, 1) else {}
    return done, results


# Slow: each runs the harness's quick profile against real servers (20 s or more), the
# longest tests of the default run; tox -e slow runs them.
@pytest.mark.slow
@pytest.mark.parametrize(
    "generator",
    [
        "builtin",
        pytest.param(
            "external",
            marks=pytest.mark.skipif(
                not (shutil.which("wrk") and shutil.which("h2load")),
                reason="wrk and h2load are not installed",
            ),
        ),
    ],
)
def test_quick_run_has_no_errors_and_plausible_numbers(tmp_path, generator):
    done, results = run_quick(tmp_path, generator)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = results["summary"]
    assert len(summary) == QUICK_SCENARIOS
    for cell in summary:
        assert cell["status"] == "ok", cell
        assert cell["errors"] == 0, cell
        assert cell["generator"] in (("builtin",) if generator == "builtin" else ("wrk", "h2load"))
        assert cell["rps"]["median"] > 5, cell  # even batch 256 on a busy 2-core box
        assert 0 < cell["p50_ms"]["median"] <= cell["p99_ms"]["median"] < 5000, cell
        assert cell["requests"] >= cell["rps"]["median"], cell  # 2 s of load
        assert 0 < cell["server_cpu_pct"] <= 250, cell
        assert cell["generator_cpu_pct"] > 0, cell
        assert cell["peak_rss_mib"] > 20, cell
        assert set(cell["stages_us"]) == {"queue", "decode", "predict", "encode"}, cell
        assert cell["rps_ratio"] == 1.0  # the only server is its own baseline
    for name in results["settings"]["scenarios"]:
        assert name in done.stdout  # the rich table lists every scenario
    assert "failed" not in done.stdout
    assert (tmp_path / "out" / "results.png").stat().st_size > 1000
    assert (
        "| iris/b1/rest-json/c64 | inferpool-w0 |" in (tmp_path / "out" / "results.md").read_text()
    )
