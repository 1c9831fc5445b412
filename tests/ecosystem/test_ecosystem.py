"""inferpool beside the packages a team already has (tox's ecosystem environment): for each
of kserve, tritonclient[all], MLServer 1.7.1 with its runtimes, MLflow and Ray Serve,
``pip install inferpool[all] <them>`` in ONE command into a brand-new virtualenv, with
plain pip, must take them at the releases pip picks for them alone (a dry run first: the
newest that fit together today), so inferpool drags none back to an old release, leave
``pip check`` clean, and the server installed there must pass its smoke test: the demo
served, an inference answered, ``/metrics`` 200, the other package still importable.

(kserve 0.21 once required psutil<6 where inferpool required >=6: pip backtracked through
old kserve releases into an sdist that did not build.) The wheel is built once from the
checkout; the installs download from the index.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import free_port, wait_for_200

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT = 900  # seconds: the heaviest (ray, mlflow) take 1-2 minutes here

# name -> (requirements installed with inferpool[all], what must import beside it)
COMBINATIONS = {
    "kserve": (["kserve"], "import kserve"),
    "tritonclient": (["tritonclient[all]"], "import tritonclient.grpc, tritonclient.http"),
    "mlserver": (
        ["mlserver==1.7.1", "mlserver-sklearn==1.7.1", "mlserver-xgboost==1.7.1",
         "mlserver-lightgbm==1.7.1"],
        "import mlserver, mlserver_sklearn, mlserver_xgboost, mlserver_lightgbm",
    ),
    "mlflow": (["mlflow<4"], "import mlflow, mlflow.pyfunc"),
    "ray": (["ray[serve]"], "import ray, ray.serve"),
}  # fmt: skip
# The virtualenvs see only what was installed into them: no PYTHONPATH (a checkout on it
# would satisfy `inferpool` and pip would not install the wheel).
CLEAN_ENVIRONMENT = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
BODY = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                    "data": [5.1, 3.5, 1.4, 0.2, 6.7, 3.0, 5.2, 2.3]}]}  # fmt: skip


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The wheel, built once for all the test processes (tox runs two): the first builds
    it into their shared temporary folder, under a lock, and the others take it."""
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent  # xdist: one folder per worker, under a common one
    with (shared / "wheel.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = shared / "wheel"
        if not any(out.glob("inferpool-*.whl")):
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                 str(out), str(ROOT)],
                check=True, timeout=INSTALL_TIMEOUT,
            )  # fmt: skip
    (built,) = out.glob("inferpool-*.whl")
    return built


def project(requirement: str) -> str:
    return re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def resolved(venv: Path, requirements: list[str]) -> dict[str, str]:
    """The releases pip resolves ``requirements`` to on their own (a dry run into a new
    ``venv``), by project: the newest that fit together, today."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    result = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check",
         "--dry-run", "--quiet", "--report", "-", *requirements],
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT, env=CLEAN_ENVIRONMENT,
        cwd=venv,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-6000:]
    report = json.loads(result.stdout)
    picked = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
              for item in report["install"]}  # fmt: skip
    return {project(r): picked[project(r)] for r in requirements}


def versions(venv: Path) -> dict[str, str]:
    """What is installed in ``venv``, by project."""
    listed = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "list", "--format", "json"],
        capture_output=True, text=True, timeout=120, env=CLEAN_ENVIRONMENT, check=True,
    )  # fmt: skip
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listed.stdout)}


def install(venv: Path, requirements: list[str]) -> str:
    """``pip install`` into ``venv`` (made by ``resolved``) in one command; pip's output."""
    result = subprocess.run(
        # --no-compile: pip's byte-compiling of ray, mlflow and kserve changes nothing
        # resolved or served, and takes CPU time the five installs share.
        [venv / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check",
         "--progress-bar", "off", "--no-compile", *requirements],
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT, env=CLEAN_ENVIRONMENT,
        cwd=venv,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


def serve_demo(venv: Path, folder: Path) -> Iterator[tuple[str, str]]:
    """``inferpool serve --demo`` from the virtualenv (outside the checkout); the REST and
    metrics URLs."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = folder / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [venv / "bin" / "inferpool", "serve", "--demo", "--workers", "1",
             "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
            cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=CLEAN_ENVIRONMENT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{http}"
    try:
        # Generous: .ci/run runs these beside the default environment, at nice 15.
        wait_for_200(f"{url}/v2/health/ready", process, log.read_text, timeout=600)
        yield url, f"http://127.0.0.1:{metrics}/metrics"
    finally:
        process.terminate()
        try:
            assert process.wait(60) == 0, log.read_text()[-4000:]
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    assert "Traceback" not in log.read_text(), log.read_text()[-4000:]


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_inferpool_installs_and_serves_beside(name: str, wheel: Path, tmp_path: Path) -> None:
    requirements, imports = COMBINATIONS[name]
    venv = tmp_path / "venv"
    alone = resolved(venv, requirements)  # what pip picks for them without inferpool
    install(venv, [f"{wheel}[all]", *requirements])
    installed = versions(venv)
    assert installed["inferpool"]
    for project, version in alone.items():
        # inferpool beside them took none of them back to an older release
        assert installed[project] == version, (project, installed[project], version)
    check = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "check"], capture_output=True, text=True,
        timeout=120, cwd=tmp_path, env=CLEAN_ENVIRONMENT,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    beside = subprocess.run(
        [venv / "bin" / "python", "-c", f"{imports}; import inferpool.cli"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=CLEAN_ENVIRONMENT,
    )  # fmt: skip
    assert beside.returncode == 0, beside.stderr[-4000:]
    for url, metrics in serve_demo(venv, tmp_path):
        answer = httpx.post(f"{url}/v2/models/iris-rf/infer", json=BODY, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [0, 2]
        scraped = httpx.get(metrics, timeout=30)
        assert scraped.status_code == 200, scraped.text[-4000:]
        assert 'inferpool_open_connections{frontend="rest"}' in scraped.text
