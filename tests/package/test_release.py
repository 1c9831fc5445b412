"""What publishing needs of the distribution: ``twine check --strict`` passes on the sdist
and the wheel; the version is the same in the wheel's metadata, ``inferpool --version`` and
``inferpool.__version__`` (it is written once, in inferpool/__init__.py); the smoke test
that cibuildwheel runs on each wheel it builds passes on ours; and cibuildwheel reads
pyproject.toml's configuration as the manylinux x86-64 and aarch64 wheels of CPython
3.11-3.13 (``--print-build-identifiers``: nothing is built)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from inferpool import __version__

# The first test to use the virtualenv waits for its install (numpy, pandas, scikit-learn):
# minutes on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
SMOKE = Path(__file__).with_name("wheel_smoke.py")


def test_twine_check_strict(dist: Path):
    files = sorted(str(path) for path in dist.iterdir())
    assert len(files) == 2, files  # the sdist and the wheel
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_the_version_agrees_in_the_wheel_the_command_and_the_module(dist: Path, venv: Path):
    (wheel,) = dist.glob("inferpool-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(archive.read(metadata).decode())
    command = subprocess.run([venv / "bin" / "inferpool", "--version"], capture_output=True,
                             text=True, timeout=60, check=True)  # fmt: skip
    module = subprocess.run(
        [venv / "bin" / "python", "-c", "import inferpool; print(inferpool.__version__)"],
        capture_output=True, text=True, timeout=60, check=True, cwd=venv,
    )  # fmt: skip
    versions = {
        "wheel": meta["Version"],
        "inferpool --version": command.stdout.splitlines()[0].removeprefix("inferpool "),
        "installed inferpool.__version__": module.stdout.strip(),
        "checkout": __version__,
    }
    assert set(versions.values()) == {__version__}, versions


def test_the_version_is_written_once():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "inferpool.__version__"}


def test_the_cibuildwheel_smoke_test_passes_on_the_installed_wheel(venv: Path, tmp_path: Path):
    # As cibuildwheel runs it: test-sources copied into an empty folder, outside the checkout.
    shutil.copy(SMOKE, tmp_path)
    result = subprocess.run(
        [venv / "bin" / "python", "wheel_smoke.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "ok"


def test_cibuildwheel_builds_manylinux_x86_64_and_aarch64_for_cpython_3_11_to_3_13():
    result = subprocess.run(
        [sys.executable, "-m", "cibuildwheel", "--print-build-identifiers", "--platform",
         "linux", str(ROOT)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    identifiers = set(result.stdout.split())
    assert identifiers == {
        f"cp3{minor}-manylinux_{arch}" for minor in (11, 12, 13) for arch in ("x86_64", "aarch64")
    }, identifiers
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    # the test command runs the file test-sources copies next to it
    assert config["test-command"] == f"python {SMOKE.name}"
    assert [ROOT / source for source in config["test-sources"]] == [SMOKE]
