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
import subprocess
import time
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support import free_port, wait_for_200

# The first build downloads every wheel of inferpool[all] and writes each layer in full
# (vfs storage): minutes, not seconds.
pytestmark = pytest.mark.timeout(1800)

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
STORAGE = ("--storage-driver", "vfs")
# runc, and the host's network (buildah's default runtime may be crun, which refuses this
# machine's hybrid cgroups).
RUNC = ("--runtime", "/usr/bin/runc", "--isolation", "oci", "--network", "host")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
IRIS = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                    "data": [5.1, 3.5, 1.4, 0.2, 6.7, 3.0, 5.2, 2.3]}]}  # fmt: skip


def buildah(*args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        ["buildah", *STORAGE, *args], capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"buildah {args[0]}: {result.stderr}"
    return result.stdout


@pytest.fixture(scope="session")
def image() -> str:
    base = subprocess.run(
        ["sh", "scripts/build_image_base.sh", "build/image"],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=600,
    ).stdout.split()[-1]  # fmt: skip
    name = f"localhost/inferpool:{VERSION}"
    # No layer cache (--layers): with vfs storage every layer committed is a full copy of
    # the tree, which made a build three times slower (12 minutes against 4) and saved
    # time only when nothing at all had changed.
    previous = subprocess.run(
        ["buildah", *STORAGE, "inspect", "--type", "image", "--format", "{{.FromImageID}}", name],
        capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    buildah(
        "bud", "--isolation", "chroot", "-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro",
        "--build-arg", f"BASE={base}", "-t", name, str(ROOT), timeout=1500,
    )  # fmt: skip
    if previous:  # the last run's image, untagged now: its copy of the tree goes
        subprocess.run(["buildah", *STORAGE, "rmi", previous], capture_output=True, timeout=120)
    return name


@pytest.fixture(scope="session")
def container(image: str) -> Iterator[str]:
    """One working container of the image; each test runs its own process in it."""
    name = buildah("from", image).strip()
    yield name
    buildah("rm", name)


@pytest.fixture(scope="session")
def config(container: str) -> dict:
    return json.loads(buildah("inspect", "--type", "container", container))["OCIv1"]["config"]


@pytest.fixture
def no_shm(tmp_path: Path) -> Path:
    folder = tmp_path / "no-shm"
    folder.mkdir()
    return folder


class Running:
    """A process run in the container by runc, its output in a file."""

    def __init__(
        self, container: str, command: list[str], no_shm: Path, volume: str | None = None
    ) -> None:
        self.http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        # The host's network: bound to its loopback alone (the image's default is 0.0.0.0).
        options = [*RUNC, "-v", f"{no_shm}:/dev/shm:ro", "--env", "INFERPOOL_HOST=127.0.0.1"]
        if volume is not None:
            options += ["-v", volume]
        for name, port in (("HTTP", self.http_port), ("GRPC", grpc_port),
                           ("METRICS", metrics_port)):  # fmt: skip
            options += ["--env", f"INFERPOOL_{name}_PORT={port}"]
        self.log = no_shm.parent / "container.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                ["buildah", *STORAGE, "run", *options, container, "--", *command],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180) -> None:
        wait_for_200(self.url + "/v2/health/ready", self.process, self.output, timeout, 0.2)

    def processes(self) -> list[psutil.Process]:
        """The container's processes, seen from the host (runc is buildah's child)."""
        return psutil.Process(self.process.pid).children(recursive=True)

    def tini(self) -> psutil.Process:
        (tini,) = [p for p in self.processes() if _command(p)[:1] == ["/usr/bin/tini"]]
        return tini

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.tini().pid, signal.SIGTERM)
        try:
            self.process.wait(90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def _command(process: psutil.Process) -> list[str]:
    """Its command line; none for a process that exited meanwhile (buildah's and runc's
    helpers come and go: one may be a zombie for a moment)."""
    try:
        return process.cmdline()
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return []


def default_command(config: dict) -> list[str]:
    return [*config["Entrypoint"], *config["Cmd"]]


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
