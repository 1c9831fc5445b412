"""BentoML, LitServe and Ray Serve, each in a virtualenv of its own made by the harness on first
use (pip, from PyPI), like MLServer's and KServe's (``mlserver_env``, ``kserve_env``).

Each pins its framework and the model libraries at the harness's versions (the models are
joblib pickles and boosters' files saved by them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.kserve_env import LIBRARIES, installed_distribution

HERE = Path(__file__).resolve().parent
# kind -> (distribution as pip installs it, its name in the metadata, version)
FRAMEWORKS = {
    "bentoml": ("bentoml", "bentoml", "1.4.40"),
    "litserve": ("litserve", "litserve", "0.2.19"),
    "rayserve": ("ray[serve]", "ray", "2.60.0"),
}


def venv(kind: str) -> Path:
    return HERE / f".venv-{kind}"


def requirements(kind: str) -> list[str]:
    """The framework at its pinned version, the model libraries at the harness's."""
    extra, _, version = FRAMEWORKS[kind]
    libraries = [installed_distribution(names) for names in LIBRARIES.values()]
    return [f"{extra}=={version}", *(f"{name}=={have}" for name, have in libraries)]


def probe(kind: str, python: Path) -> str | None:
    """None when ``python`` holds the framework and the libraries at the pinned versions,
    else what is wrong. Read from the distributions' metadata: importing Ray takes seconds."""
    if not python.exists():
        return f"{python} does not exist"
    _, dist, version = FRAMEWORKS[kind]
    wanted = {dist: version}
    wanted |= dict(installed_distribution(names) for names in LIBRARIES.values())
    script = (
        "import importlib.metadata as m\n"
        f"for d in {list(wanted)!r}:\n"
        "    try: print(d, m.version(d))\n"
        "    except m.PackageNotFoundError: print(d, 'missing')\n"
    )
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["probe failed"])[-1]
    found = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    wrong = [f"{d} {found.get(d)} (want {v})" for d, v in wanted.items() if found.get(d) != v]
    return ", ".join(wrong) or None


def ensure(kind: str) -> Path:
    """The python of the peer's virtualenv, installing it first if needed (minutes)."""
    folder = venv(kind)
    python = folder / "bin" / "python"
    if probe(kind, python) is None:
        return python
    print(f"installing {' '.join(requirements(kind))} into {folder}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    with (folder / "install.log").open("w") as sink:
        done = subprocess.run([*pip, *requirements(kind)], stdout=sink, stderr=sink)
    problem = probe(kind, python)
    if done.returncode != 0 or problem is not None:
        raise RuntimeError(
            f"{kind} install in {folder} did not work (pip exited {done.returncode}: "
            f"{pip_error(folder / 'install.log')}; {problem}); see {folder / 'install.log'}"
        )
    return python


def pip_error(log: Path) -> str:
    """pip's last ``ERROR:`` line in its log (its reason), else the log's last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["no output"])[-1]
