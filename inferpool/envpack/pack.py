"""Build an environment tarball: a virtualenv holding a model's requirements, written as a
gzip tarball whose members sit at its root (``bin/``, ``lib/``, ``pyvenv.cfg``), as
conda-pack writes them, so ``engine.environments.prepare`` unpacks and starts it.

The virtualenv is made without pip (``venv --without-pip`` takes a tenth of a second;
with pip, seconds), and the server's own pip installs into it (``pip --python``). inferpool
is not installed into it: the server puts its own packages after the environment's.
The tarball is written beside OUT under a temporary name and renamed over OUT only once
complete, so a failure leaves an existing OUT as it was.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from inferpool.engine.environments.unpack import KEY_DIGITS, tarball_digest
from inferpool.envpack.sources import SourceRefused, check_python, read_needs

# ``pip --python`` (run pip against another interpreter) came in pip 22.3.
MIN_PIP = (22, 3)
_VERSION = "import sys; print('.'.join(map(str, sys.version_info[:3])))"
_INSTALLED = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted({(d.metadata['Name'], d.version) for d in m.distributions()})))"
)


class PackFailed(Exception):
    """The environment could not be packed; the message is one line saying why."""


@dataclass(frozen=True, slots=True)
class Packed:
    """What ``pack`` wrote."""

    out: Path
    size: int
    sha256: str
    python: str  # the environment's Python version, X.Y.Z
    installed: tuple[tuple[str, str], ...]  # (name, version) of every package inside

    @property
    def key(self) -> str:
        """The key ``prepare`` caches the unpacked tarball under."""
        return self.sha256[:KEY_DIGITS]


def pack(
    source: Path,
    out: Path,
    *,
    python: Path | None = None,
    pip_options: Sequence[str] = (),
    say: Callable[[str], None] = print,
) -> Packed:
    """Pack the requirements of ``source`` (an MLflow model folder, a requirements.txt, a
    python_env.yaml or a conda.yaml) into the tarball ``out``; ``python`` is the
    environment's interpreter (default: the server's base interpreter); ``pip_options``
    go to ``pip install`` (``--no-index``, ``--find-links DIR``...). ``PackFailed``."""
    try:
        needs = read_needs(source)
    except SourceRefused as exc:
        raise PackFailed(str(exc)) from None
    interpreter = python or Path(getattr(sys, "_base_executable", "") or sys.executable)
    python_version = _python_version(interpreter)
    try:
        check_python(needs, _version_tuple(python_version), interpreter)
    except SourceRefused as exc:
        raise PackFailed(str(exc)) from None
    _check_pip()
    out = out.absolute()
    if out.is_dir():
        raise PackFailed(f"{out} is a folder: name the tarball to write")
    if not out.parent.is_dir():
        raise PackFailed(f"cannot write {out}: the folder {out.parent} does not exist")
    with tempfile.TemporaryDirectory(prefix="inferpool-env-pack-") as scratch:
        venv = Path(scratch) / "env"
        _run([str(interpreter), "-m", "venv", "--without-pip", str(venv)], "python -m venv failed")
        say(f"created a virtualenv with Python {python_version} ({interpreter})")
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text("".join(line + "\n" for line in needs.requirements))
        _install(venv, requirements, needs.origin, pip_options)
        installed = _installed(venv)
        listed = ", ".join(f"{name} {number}" for name, number in installed) or "nothing"
        say(f"installed from {needs.origin}: {listed}")
        _write_tarball(venv, out)
    sha256 = tarball_digest(out)
    return Packed(out, out.stat().st_size, sha256, python_version, installed)


def _python_version(interpreter: Path) -> str:
    try:
        result = subprocess.run(
            [str(interpreter), "-I", "-c", _VERSION],
            capture_output=True, text=True, timeout=60, env=_clean_environment(),
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PackFailed(f"--python {interpreter} cannot be run: {exc}") from None
    answer = result.stdout.strip()
    if result.returncode != 0 or not re.fullmatch(r"\d+\.\d+\.\d+", answer):
        raise PackFailed(f"--python {interpreter} is not a Python interpreter that runs here")
    return answer


def _version_tuple(text: str) -> tuple[int, int, int]:
    major, minor, micro = (int(part) for part in text.split("."))
    return major, minor, micro


def _check_pip() -> None:
    try:
        installed = tuple(int(part) for part in version("pip").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        installed = ()
    if installed < MIN_PIP:
        raise PackFailed(
            f"packing runs pip {'.'.join(map(str, MIN_PIP))} or newer from inferpool's own "
            f"environment: install it there ({sys.executable} -m pip install -U pip)"
        )


def _clean_environment() -> dict[str, str]:
    # A PYTHONPATH would show the server's packages to pip as already installed.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _run(command: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, cwd=cwd, env=_clean_environment()
        )
    except OSError as exc:
        raise PackFailed(f"{what} could not start: {exc}") from None
    if result.returncode != 0:
        raise PackFailed(f"{what}: {_reason(result.stderr or result.stdout)}")
    return result.stdout


def _reason(output: str) -> str:
    """pip's (or venv's) first ``ERROR:`` line, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    if errors:
        return errors[0]
    return lines[-1] if lines else "no output"


def _install(venv: Path, requirements: Path, origin: Path, pip_options: Sequence[str]) -> None:
    command = [
        sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
        "--disable-pip-version-check", "--no-input", "--no-warn-script-location",
        *pip_options, "-r", str(requirements),
    ]  # fmt: skip
    # Relative paths in the requirements (./wheels/x.whl) are relative to where they are.
    _run(command, f"pip could not install the requirements of {origin}", cwd=origin.parent)


def _installed(venv: Path) -> tuple[tuple[str, str], ...]:
    python = str(venv / "bin" / "python")
    output = _run([python, "-I", "-c", _INSTALLED], "listing the installed packages failed")
    return tuple((str(name), str(number)) for name, number in json.loads(output))


def _write_tarball(venv: Path, out: Path) -> None:
    fd, part_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    part = Path(part_name)
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            tarfile.open(
                fileobj=raw,
                mode="w:gz",
                compresslevel=6,  # 9 costs twice the time for 2% less
            ) as archive,
        ):
            for entry in sorted(venv.iterdir()):
                archive.add(entry, arcname=entry.name)
        umask = os.umask(0)
        os.umask(umask)
        part.chmod(0o666 & ~umask)  # mkstemp's 0600 would hide it from the server's user
        part.replace(out)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise PackFailed(f"cannot write {out}: {exc}") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
