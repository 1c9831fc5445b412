"""``inferpool --version`` names the installed distribution's version and exits 0."""

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
    assert result.stdout == f"inferpool {version('inferpool')}\n"


def test_version_needs_no_command():
    """A bare ``inferpool`` still asks for a command: --version alone is the exception."""
    result = subprocess.run(
        [sys.executable, "-m", "inferpool"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--version" in result.stderr
