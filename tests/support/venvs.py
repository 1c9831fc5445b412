"""Virtualenvs the tests fill with pip from a requirements file (packages inferpool's own
environment cannot hold beside it: MLServer's alibi runtimes, numpy 1), made once and kept
by the file's content, so that a rerun reuses them."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# tox's environments environment names where they are kept; elsewhere, the system's
# temporary folder (kept across runs: a virtualenv holding TensorFlow is ~2 GB).
VENVS_VARIABLE = "INFERPOOL_TEST_VENVS"


def venvs_folder() -> Path:
    named = os.environ.get(VENVS_VARIABLE)
    return Path(named) if named else Path(tempfile.gettempdir()) / "inferpool-test-venvs"


def venv_from(
    requirements: Path, *then: Path, folder: Path | None = None, timeout: float = 1800
) -> Path:
    """The virtualenv holding ``requirements``, then each file of ``then`` installed over
    it (one pip command each, from the configured index: a later file may override what
    an earlier one's packages require), made under ``folder`` (``venvs_folder()``) unless a
    run before made it from the same files: its name holds the hash of the files and of
    the interpreter's version. Two processes asking for it at once make it once (a lock
    file); one that was cut short is made again."""
    folder = folder or venvs_folder()
    folder.mkdir(parents=True, exist_ok=True)
    files = (requirements, *then)
    content = b"".join(f.read_bytes() for f in files) + sys.version.encode()
    venv = folder / f"{requirements.stem}-{hashlib.sha256(content).hexdigest()[:12]}"
    complete = venv / "installed.txt"
    with open(folder / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete.exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        # --no-compile: the tests import a small part of what is installed (TensorFlow's
        # byte-compiling alone would take minutes of CPU the other lanes of CI share).
        for file in files:
            install = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                       "--no-compile", "-r", str(file)]  # fmt: skip
            done = subprocess.run(install, capture_output=True, text=True, timeout=timeout)
            if done.returncode != 0:
                raise RuntimeError(f"pip install -r {file} failed:\n{done.stderr[-4000:]}")
        listed = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "freeze"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        seconds = time.monotonic() - started
        complete.write_text(f"# installed in {seconds:.0f} s\n{listed.stdout}")
    return venv


def installed(venv: Path) -> dict[str, str]:
    """What ``venv_from`` installed, by lowercase project name (pip freeze's)."""
    lines = (venv / "installed.txt").read_text().splitlines()
    pairs = (line.split("==", 1) for line in lines if "==" in line)
    return {name.lower().replace("_", "-"): version for name, version in pairs}


def main(arguments: list[str]) -> None:
    """Make the virtualenvs of these requirements files at once (tox's commands_pre), one
    per argument (files installed one after the other joined by commas), printing how
    long each took."""
    from concurrent.futures import ThreadPoolExecutor

    def make(names: str) -> str:
        started = time.monotonic()
        venv = venv_from(*(Path(name) for name in names.split(",")))
        return f"{venv}: {time.monotonic() - started:.0f} s"

    with ThreadPoolExecutor(len(arguments)) as pool:
        for line in pool.map(make, arguments):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
