"""MLServer 1.7.1 in the harness's own virtualenv, installed from PyPI on first use.

Kept apart from the project's environment: MLServer pins its own dependency versions, and
its parallel workers crash with uvloop 0.22, hence ``uvloop<0.22``. scikit-learn is pinned
to the harness's version because the benchmark models are joblib pickles.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MLSERVER_VERSION = "1.7.1"
VENV = Path(__file__).resolve().parent / ".venv-mlserver"
# mlserver-catboost brings CatBoost (the catboost profile's peer).
RUNTIMES = ("mlserver-sklearn", "mlserver-lightgbm", "mlserver-xgboost", "mlserver-catboost")


def requirements() -> list[str]:
    import sklearn

    pins = [f"mlserver=={MLSERVER_VERSION}", *(f"{r}=={MLSERVER_VERSION}" for r in RUNTIMES)]
    return [*pins, "uvloop<0.22", f"scikit-learn=={sklearn.__version__}"]


def installed(venv: Path = VENV) -> bool:
    """True when the venv holds MLServer at the pinned version with every runtime and a
    uvloop older than 0.22. Read from the distributions' metadata, not by importing them:
    importing MLServer takes 5 to 20 s, the quick profile's whole margin."""
    python = venv / "bin" / "python"
    if not python.exists():
        return False
    names = ("mlserver", *RUNTIMES, "uvloop")
    probe = f"import importlib.metadata as m; print(*(m.version(d) for d in {names!r}))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return False
    *versions, uvloop_version = done.stdout.split()
    return versions == [MLSERVER_VERSION] * (1 + len(RUNTIMES)) and uvloop_version.startswith(
        ("0.1", "0.20", "0.21")
    )


def ensure(venv: Path = VENV, log: Path | None = None) -> Path:
    """The ``mlserver`` executable, installing the venv first if needed (a few minutes)."""
    if not installed(venv):
        print(
            f"installing MLServer {MLSERVER_VERSION} into {venv} (first use only)", file=sys.stderr
        )
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        with (log or venv / "install.log").open("w") as sink:
            subprocess.run([*pip, *requirements()], check=True, stdout=sink, stderr=sink)
        if not installed(venv):
            raise RuntimeError(f"MLServer install in {venv} did not work; see its install.log")
    return venv / "bin" / "mlserver"
