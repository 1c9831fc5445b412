"""``python -m benchmarks cores``: the CPU of a request split by process role, the model
of throughput against cores built on it, and the whole measurement on a real server
(short runs: tox -e slow runs this file)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import cores
from benchmarks.runner import Config

BURN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"


def test_one_frontend_caps_the_rate_whatever_the_cores() -> None:
    split = cores.Split(frontend=20.0, workers=40.0, generator=15.0)
    assert split.rate(2) == pytest.approx(2e6 / 60)  # the cores bound it
    assert split.rate(16) == pytest.approx(1e6 / 20)  # one event loop's worth
    assert split.rate(16, frontends=3) == pytest.approx(3e6 / 20)
    assert split.rate(2, with_generator=True) == pytest.approx(2e6 / 75)


def test_enough_frontends_let_the_cores_bound_the_rate() -> None:
    split = cores.Split(frontend=40.0, workers=20.0, generator=0.0)
    for count in cores.PROJECTED_CORES:
        needed = split.frontends_needed(count)
        assert split.rate(count, needed) == pytest.approx(count * 1e6 / 60)
        if needed > 1:  # one fewer would not do
            assert split.rate(count, needed - 1) < count * 1e6 / 60
    assert split.frontends_needed(1) == 1


def test_the_tree_is_split_into_frontend_and_workers() -> None:
    """A parent that burns 0.3 s, whose child and grandchild burn 0.2 s each (and live on:
    a process that has exited is no longer in the tree)."""
    grandchild = BURN.format(seconds=0.2) + "time.sleep(3)\n"
    child = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}])\n"
        + BURN.format(seconds=0.2)
        + "p.wait()\n"
    )
    parent = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        + BURN.format(seconds=0.3)
        + "sys.stdin.read()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", parent], stdin=subprocess.PIPE)
    try:
        # Until all three have burnt (a busy host may take a while); then the parent waits
        # on stdin and the others on their children.
        deadline = time.monotonic() + 30
        usage = cores.role_cpu(process.pid)
        while usage["frontend"] < 0.3 or usage["workers"] < 0.4:
            assert time.monotonic() < deadline, usage
            time.sleep(0.1)
            usage = cores.role_cpu(process.pid)
        time.sleep(0.2)
        usage = cores.role_cpu(process.pid)
    finally:
        process.communicate(b"")
    assert usage["frontend"] < 0.3 + 0.25, usage  # its burn and its start-up, no more
    assert usage["workers"] < 0.4 + 0.5, usage  # theirs: the parent's is not counted twice
    assert cores.role_cpu(process.pid) == {"frontend": 0.0, "workers": 0.0}  # gone


def test_cores_measures_a_server_and_predicts_its_rate(tmp_path: Path) -> None:
    config = Config(
        scenarios=cores.SCENARIOS,
        servers=("inferpool-w1",),
        baseline="inferpool-w1",
        duration=1.0,
        warmup=0.5,
        repetitions=1,
        workdir=tmp_path / "out",
        repo=tmp_path / "repo",
    )
    result = cores.run(config, say=lambda text: None)
    summary = result["summary"]["inferpool-w1"]
    assert set(summary) == {scenario.name for scenario in cores.SCENARIOS}
    for cell in summary.values():
        assert cell["rps"] > 0 and cell["errors"] == 0
        assert cell["frontend_us"] > 0 and cell["workers_us"] > 0
        # Whatever the machine, the model's rate is bounded by its inputs.
        per_request = cell["frontend_us"] + cell["workers_us"] + cell["generator_us"]
        assert cell["predicted_here"] <= result["cores"] * 1e6 / per_request * 1.0001
        projected = cell["projection"]
        assert projected["32"]["one_frontend"] == pytest.approx(1e6 / cell["frontend_us"])
        assert projected["32"]["enough_frontends"] > projected["32"]["one_frontend"]
    assert "| inferpool-w1 | iris/b1/rest-json/c64 |" in cores.markdown(result)
