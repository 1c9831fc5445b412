"""KServe 0.21 in the harness's own virtualenv, installed with pip on first use.

Kept apart from the project's environment like MLServer's (``mlserver_env``): kserve pins
its own dependency versions (protobuf<7, fastapi, uvicorn) and registers the ``inference.*``
messages in protobuf's default pool, which tritonclient (the harness's client) also does.
scikit-learn, LightGBM and XGBoost are pinned to the harness's versions because the
benchmark models are saved by them (joblib pickles, boosters' files).

``INFERPOOL_KSERVE_PYTHON`` names another python that imports kserve (any version) and the
three libraries at the harness's versions (tox's ``clients`` environment has them): then
nothing is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

KSERVE_VERSION = "0.21.0"
VENV = Path(__file__).resolve().parent / ".venv-kserve"
# Import name -> the distributions that may provide it here (xgboost-cpu is what the
# project's xgboost extra installs; both import as xgboost).
LIBRARIES = {
    "sklearn": ("scikit-learn",),
    "lightgbm": ("lightgbm",),
    "xgboost": ("xgboost-cpu", "xgboost"),
}
OVERRIDE = "INFERPOOL_KSERVE_PYTHON"


def installed_distribution(names: tuple[str, ...]) -> tuple[str, str]:
    """The first of ``names`` installed in this environment, with its version."""
    for name in names:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    raise RuntimeError(f"none of {names} is installed: pip install -e '.[bench]'")


def requirements() -> list[str]:
    """kserve at the pinned version, the model libraries at the harness's versions."""
    pins = [f"kserve=={KSERVE_VERSION}"]
    for names in LIBRARIES.values():
        name, version = installed_distribution(names)
        pins.append(f"{name}=={version}")
    return pins


def probe(python: Path, pinned: bool = True) -> str | None:
    """None when ``python`` imports kserve (at the pinned version when ``pinned``) and the
    libraries at the harness's versions, else what is wrong."""
    if not python.exists():
        return f"{python} does not exist"
    script = (
        "import importlib.metadata as m, kserve, sklearn, lightgbm, xgboost, joblib;"
        "print(m.version('kserve'), sklearn.__version__, lightgbm.__version__,"
        " xgboost.__version__)"
    )
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["import failed"])[-1]
    found = done.stdout.split()
    wanted = [KSERVE_VERSION, *(installed_distribution(n)[1] for n in LIBRARIES.values())]
    names = ["kserve", *LIBRARIES]
    if len(found) != len(wanted):
        return f"unexpected versions printed: {done.stdout.strip()!r}"
    if not pinned:
        found, wanted, names = found[1:], wanted[1:], names[1:]
    wrong = [
        f"{name} {have} (want {want})"
        for name, have, want in zip(names, found, wanted, strict=True)
        if have != want
    ]
    return ", ".join(wrong) or None


def ensure(venv: Path = VENV, log: Path | None = None) -> Path:
    """The python that runs the KServe peer, installing the venv first if needed (about two
    minutes from a local package mirror)."""
    override = os.environ.get(OVERRIDE)
    if override:
        python = Path(override)
        problem = probe(python, pinned=False)
        if problem is not None:
            raise RuntimeError(f"{OVERRIDE}={override} cannot run the KServe peer: {problem}")
        return python
    python = venv / "bin" / "python"
    if probe(python) is not None:
        print(f"installing KServe {KSERVE_VERSION} into {venv} (first use only)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet"]
        with (log or venv / "install.log").open("w") as sink:
            subprocess.run([*pip, *requirements()], check=True, stdout=sink, stderr=sink)
        problem = probe(python)
        if problem is not None:
            raise RuntimeError(
                f"KServe install in {venv} did not work ({problem}); see its install.log"
            )
    return python
