"""``python -m benchmarks memory``: the PSS reading of a server's processes (benchmarks/pss.py),
the budget, the RESULTS.md section, and one real run with one worker and a tiny forest."""

import argparse
import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from benchmarks.__main__ import main
from benchmarks.memory import (
    MODEL,
    ForestRecipe,
    ServerMemory,
    budget,
    build_forest,
    worker_counts,
    write_section,
)
from benchmarks.pss import MIB, TEMPLATE_MODULE, ProcessMemory, roles, total, tree_memory


def test_roles_name_the_frontend_the_template_and_its_workers():
    frontend = ["python", "-m", "inferpool", "serve", "repo"]
    template = ["python", "-m", TEMPLATE_MODULE, "17", "{}"]
    processes = [
        (10, 1, frontend),
        (11, 10, template),
        (12, 11, template),  # forked by the template: same command line
        (13, 11, template),
        (14, 10, ["sh", "-c", "true"]),
        (15, 1, template),  # its template exited: handed to init
    ]
    assert roles(processes, root=10) == {
        10: "frontend",
        11: "template",
        12: "worker",
        13: "worker",
        14: "other",
        15: "worker",
    }


# A parent that touches 64 MiB, then forks a child that only reads: the pages are shared.
_FORKED = """
import os, sys, time
block = b"x" * (64 << 20)
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


def test_tree_pss_counts_a_page_shared_by_a_fork_once():
    code = [sys.executable, "-c", _FORKED]
    with subprocess.Popen(code, stdout=subprocess.PIPE, start_new_session=True) as parent:
        child = int(parent.stdout.readline())
        try:
            processes = tree_memory(parent.pid)
            assert [p.role for p in processes] == ["frontend", "other"]
            rss = sum(p.rss for p in processes)
            assert rss > 128 * MIB  # RSS counts the block in each process
            assert 64 * MIB < total(processes) < rss - 48 * MIB  # PSS counts it about once
        finally:
            os.kill(child, signal.SIGKILL)
            parent.kill()
    assert tree_memory(parent.pid) == []


# A child that forks a grandchild and exits: the grandchild is handed to another parent.
_ORPHANED = """
import os, sys, time
child = os.fork()
if child == 0:
    grandchild = os.fork()
    if grandchild == 0:
        time.sleep(60)
    print(grandchild, flush=True)
    os._exit(0)
os.waitpid(child, 0)
time.sleep(60)
"""


def test_a_process_whose_parent_exited_still_counts_by_its_session():
    code = [sys.executable, "-c", _ORPHANED]
    with subprocess.Popen(code, stdout=subprocess.PIPE, start_new_session=True) as parent:
        grandchild = int(parent.stdout.readline())
        try:
            assert psutil.Process(grandchild).ppid() != parent.pid
            assert grandchild in {p.pid for p in tree_memory(parent.pid)}
        finally:
            os.kill(grandchild, signal.SIGKILL)
            parent.kill()


def _readings(**stages: int) -> dict[str, list[ProcessMemory]]:
    return {stage: [ProcessMemory(1, "frontend", mib * MIB, 0)] for stage, mib in stages.items()}


def test_the_budget_is_1_3_copies_plus_60_mib_per_worker_over_the_idle_server():
    copy = 200 * MIB
    assert budget(copy, 4) == 260 * MIB + 240 * MIB
    assert budget(copy, 1) == 320 * MIB
    fits = ServerMemory("inferpool-w2", 2, _readings(idle=300, loaded=680, reloaded=680))
    assert fits.added("loaded") == 380 * MIB and fits.within(copy)
    leaks = ServerMemory("inferpool-w2", 2, _readings(idle=300, loaded=680, reloaded=681))
    assert not leaks.within(copy)  # 381 MiB added after the reloads: over 380
    stopped = ServerMemory("inferpool-w2", 2, _readings(idle=300, loaded=400), error="boom")
    assert stopped.added("reloaded") is None and not stopped.within(copy)


def test_worker_counts_are_a_comma_list_of_positive_counts():
    assert worker_counts("1,2,4") == [1, 2, 4]
    for bad in ("", "0,2", "two", "1,,2"):
        with pytest.raises(argparse.ArgumentTypeError, match="comma-separated"):
            worker_counts(bad)


def test_a_section_goes_above_the_newest_one_and_keeps_the_rest(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\nHow to.\n\n## older\n\nold table\n")
    write_section("## newer\n\nnew table\n\n", results)
    assert results.read_text() == (
        "# Benchmark results\n\nHow to.\n\n## newer\n\nnew table\n\n## older\n\nold table\n"
    )


def test_a_trained_forest_is_reused(tmp_path):
    recipe = ForestRecipe(trees=2, samples=200)
    artefact = build_forest(recipe, tmp_path) / MODEL / "model.joblib"
    stamp = artefact.stat().st_mtime_ns
    build_forest(recipe, tmp_path)
    assert artefact.stat().st_mtime_ns == stamp
    assert build_forest(ForestRecipe(trees=3, samples=200), tmp_path) != artefact.parents[1]


def test_two_workers_end_to_end_with_a_tiny_forest(tmp_path, capsys):
    """Both workers predict before the loaded reading (one at a time, requests would all go
    to the first: the command once failed there, "workers [...] did not predict")."""
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# Benchmark results\n\n## older\n")
    argv = ["memory", "--workers", "2", "--trees", "3", "--samples", "400", "--reloads", "1"]
    paths = ["--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    assert main([*argv, *paths, "--write", "--results", str(results_md)]) == 0
    [server] = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    assert server["name"] == "inferpool-w2" and server["error"] == ""
    assert list(server["stages"]) == ["idle", "loaded", "reloaded", "unloaded"]
    for processes in server["stages"].values():
        roles = sorted(p["role"] for p in processes)
        assert roles == ["frontend", "template", "worker", "worker"]
        assert all(p["pss"] > 0 for p in processes)
    printed = capsys.readouterr().out
    # The verdict is the server's (pass or FAIL); an error would be the harness's.
    [row] = [line for line in printed.splitlines() if line.startswith("| inferpool-w2 | 2 | ")]
    assert row.endswith(("| pass |", "| FAIL |"))
    assert printed.strip() in results_md.read_text()
    assert results_md.read_text().endswith("## older\n")
