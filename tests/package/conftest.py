"""The package tests' fixtures: the distribution built once a session, and a brand-new
virtualenv holding its wheel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build``: the sdist, then the wheel built from the unpacked sdist."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return out


@pytest.fixture(scope="session")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv (no system site packages) with the wheel and its ``sklearn`` extra."""
    folder = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=120)
    (wheel,) = dist.glob("inferpool-*.whl")
    subprocess.run(
        [folder / "bin" / "python", "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", f"{wheel}[sklearn]"],
        check=True, timeout=600,
    )  # fmt: skip
    return folder
