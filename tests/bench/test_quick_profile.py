"""CI runs the benchmark as a user would: ``python -m benchmarks run --quick`` end to end,
on the ports of ``--port-base``, within its time, with its report written.

In CI no MLServer virtualenv exists (installing it takes minutes), so the quick profile
compares inferpool's configurations, and says so; where one is installed, MLServer runs
beside inferpool. Slow (about a minute and a half): tox -e slow runs it.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import ports

PROJECT_ROOT = Path(__file__).resolve().parents[2]
BUDGET = 180  # seconds: the profile's two minutes and room for a busy CI machine


def port_base(count: int) -> int:
    """A first port from which ``count`` ports can all be bound now."""
    for _ in range(200):
        first = ports.free_port()
        if all(ports.bindable(first + i) for i in range(count)):
            return first
    raise AssertionError(f"no {count} neighbouring free ports")


def test_the_quick_profile_runs_within_its_time_and_writes_its_report(tmp_path: Path) -> None:
    out, base = tmp_path / "out", port_base(6)
    cmd = [sys.executable, "-m", "benchmarks", "run", "--quick", "--port-base", str(base)]
    started = time.monotonic()
    done = subprocess.run(
        [*cmd, "--out", str(out), "--repo", str(tmp_path / "repo")],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=BUDGET,
    )
    elapsed = time.monotonic() - started
    print(f"quick profile: {elapsed:.0f} s")  # pytest -s shows it; CI keeps it on failure
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    results = json.loads((out / "results.json").read_text())
    settings = results["settings"]
    servers, scenarios = settings["servers"], settings["scenarios"]
    assert len(servers) == 2 and len(scenarios) == 5
    if "mlserver-w0" not in servers:
        assert servers == ["inferpool-w0", "inferpool-w2"]
        assert "MLServer is not installed" in settings["note"]
        assert "MLServer is not installed" in " ".join(done.stderr.split())
    assert [(c["scenario"], c["server"]) for c in results["summary"]] == [
        (scenario, server) for scenario in scenarios for server in servers
    ]
    assert all(c["status"] == "ok" and c["errors"] == 0 for c in results["summary"])

    # Every server on the ports --port-base gave it, in the order of its name.
    plan = ports.plan_from(base, servers)
    for name in servers:
        command = results["servers"][name]["command"]
        if name.startswith("inferpool"):
            assert command[command.index("--http-port") + 1] == str(plan[name].http)
            assert command[command.index("--grpc-port") + 1] == str(plan[name].grpc)
        else:
            written = json.loads((out / "servers" / name / "repo" / "settings.json").read_text())
            assert (written["http_port"], written["metrics_port"]) == (
                plan[name].http,
                plan[name].metrics,
            )

    # Off a terminal: one plain line per step, no bar redrawn with control codes.
    assert "\x1b" not in done.stderr
    steps = len(servers) * len(scenarios) * 2  # two repetitions each
    for name in servers:
        step = rf"^\[\d+/{steps} \d+%, elapsed \d+:\d\d, eta \d+:\d\d\] \S+ on {name}: "
        step += "repetition 2/2$"
        assert re.search(step, done.stderr, re.M), done.stderr[-2000:]
    # The table within 100 columns, every scenario in it.
    assert max(len(line) for line in done.stdout.splitlines()) <= 100, done.stdout
    for scenario in scenarios:
        assert scenario in done.stdout

    rows = list(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    assert len(rows) == len(servers) * len(scenarios)
    assert all(float(row["rps_median"]) > 0 for row in rows)
    page = (out / "report.html").read_text()
    image = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert image is not None
    assert base64.b64decode(image[1]) == (out / "results.png").read_bytes()
    for name in [*scenarios, *servers]:
        assert f"<td>{name}</td>" in page
