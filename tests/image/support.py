"""What the image tests share: buildah on vfs storage (no registry, no overlay), and a
process run in a working container by runc, as a container runtime runs it (see
test_image.py's docstring)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil

from inferpool import __version__
from tests.support import free_port, wait_for_200

ROOT = Path(__file__).resolve().parents[2]
VERSION = __version__
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
