"""``inferpool --version`` names the installed distribution's version, the Python it runs
on and the runtimes installed, and exits 0."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version


def test_version_prints_the_installed_version_and_exits_0():
    result = subprocess.run(
        [sys.executable, "-m", "inferpool", "--version"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # The first line as tools parse it; then what it is, what it runs on, its runtimes.
    assert lines[0] == f"inferpool {version('inferpool')}"
    assert lines[1] == "Open Inference Protocol (KServe V2) server for classical ML models"
    assert lines[2].startswith(f"Python {sys.version.split()[0]} on ")
    assert lines[3].startswith("runtimes: ")
    assert f"scikit-learn {version('scikit-learn')}" in lines[3]


def test_version_needs_no_command():
    """A bare ``inferpool`` still asks for a command: --version alone is the exception."""
    result = subprocess.run(
        [sys.executable, "-m", "inferpool"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--version" in result.stderr
