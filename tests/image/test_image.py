"""The container image, built from the Dockerfile and run as a container runtime runs it.

No registry is reachable, so the base is Debian bookworm made by mmdebstrap
(scripts/build_image_base.sh) and the image is built with ``buildah bud`` on it. It runs
under runc (``buildah run --isolation oci``): a PID namespace of its own, so tini is PID 1
there, as under Docker or Kubernetes; the host's network, so the test reaches it on
127.0.0.1 (on free ports, passed as INFERPOOL_* variables). /dev/shm is a read-only empty
folder in every run: the worker pool must not need it (it passes payloads in memfds).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.image.support import IRIS, ROOT, RUNC, VERSION, Running, buildah, default_command

# The first build downloads every wheel of inferpool[all] and writes each layer in full
# (vfs storage): minutes, not seconds.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="session")
def repository(container: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host folder: the demo's iris models, trained inside the image (its scikit-learn
    reads them back), and a model of a custom runtime whose requests can be made slow."""
    root = tmp_path_factory.mktemp("models")
    root.chmod(0o777)  # written by the image's user, uid 1000
    train = "from pathlib import Path; from inferpool.demo import build_demo_repository as b; "
    buildah(
        "run", *RUNC, "-v", f"{root}:/mnt/models",
        container, "--", "python", "-c", train + "b(Path('/mnt/models'))", timeout=300,
    )  # fmt: skip
    slow = root / "slow"
    slow.mkdir()
    shutil.copy(ROOT / "tests" / "support" / "echo_model.py", slow)
    settings = {"name": "slow", "implementation": "echo_model.EchoRuntime"}
    (slow / "model-settings.json").write_text(json.dumps(settings))
    for path in (slow, *slow.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def test_the_image_is_configured_as_documented(config: dict):
    assert config["Entrypoint"] == ["/usr/bin/tini", "--"]
    assert config["Cmd"] == ["inferpool", "serve", "/mnt/models"]
    assert config["User"] == "1000:1000"
    assert set(config["ExposedPorts"]) == {"8080/tcp", "8081/tcp", "8082/tcp"}


def test_the_image_holds_every_runtime_and_the_compiled_extensions_and_no_compiler(
    container: str,
):
    check = (
        "import shutil, inferpool.runtimes.trees._kernel, inferpool.engine.ipc._atomics; "
        "import sklearn, lightgbm, xgboost, mlflow.pyfunc; "
        "print([c for c in ('gcc', 'cc', 'x86_64-linux-gnu-gcc-12') if shutil.which(c)])"
    )
    assert buildah("run", *RUNC, container, "--", "python", "-c", check).strip() == "[]"


def test_version(container: str):
    version = buildah("run", *RUNC, container, "--", "inferpool", "--version").splitlines()
    assert version[0] == f"inferpool {VERSION}"
    # the image's runtimes, each with the version the image installed
    runtimes = next(line for line in version if line.startswith("runtimes: "))
    assert "scikit-learn 1." in runtimes, version


def test_the_demo_serves(container: str, no_shm: Path):
    running = Running(container, ["/usr/bin/tini", "--", "inferpool", "serve", "--demo"], no_shm)
    try:
        running.wait_ready()
        for model in ("iris-logreg", "iris-rf"):
            answer = httpx.post(f"{running.url}/v2/models/{model}/infer", json=IRIS, timeout=30)
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"][0]["data"] == [0, 2]
    finally:
        running.stop()
    assert running.process.returncode == 0, running.output()


def test_a_mounted_repository_serves_with_the_default_command_as_non_root(
    container: str, config: dict, repository: Path, no_shm: Path
):
    volume = f"{repository}:/mnt/models:ro"
    running = Running(container, default_command(config), no_shm, volume)
    try:
        running.wait_ready()
        answer = httpx.post(f"{running.url}/v2/models/iris-rf/infer", json=IRIS, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [0, 2]
        tini = running.tini()
        server, *workers = tini.children(recursive=True)
        assert "serve" in server.cmdline()
        for process in (tini, server, *workers):
            assert process.uids().real == process.uids().effective == 1000, process.cmdline()
    finally:
        running.stop()
    assert running.process.returncode == 0, running.output()


def test_sigterm_to_tini_drains_the_requests_in_flight(
    container: str, config: dict, repository: Path, no_shm: Path
):
    volume = f"{repository}:/mnt/models:ro"
    running = Running(container, default_command(config), no_shm, volume)
    slow = {"inputs": [{"name": "sleep", "shape": [1], "datatype": "FP32", "data": [2.0]}]}

    def infer(_: int) -> int:
        url = f"{running.url}/v2/models/slow/infer"
        return httpx.post(url, json=slow, timeout=60).status_code

    try:
        running.wait_ready()
        # tini is PID 1 of the container's PID namespace.
        status = Path(f"/proc/{running.tini().pid}/status").read_text()
        assert next(line for line in status.splitlines() if line.startswith("NSpid:")).endswith(
            "\t1"
        )
        with ThreadPoolExecutor(8) as pool:
            answers = pool.map(infer, range(8))
            time.sleep(0.5)  # every request reached the server and sleeps in the model
            started = time.monotonic()
            os.kill(running.tini().pid, signal.SIGTERM)
            assert list(answers) == [200] * 8
        assert running.process.wait(90) == 0, running.output()
        assert time.monotonic() - started < 60
    finally:
        if running.process.poll() is None:
            running.stop()
    assert "ERROR" not in running.output(), running.output()
