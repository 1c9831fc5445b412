"""A container of a deploy/ manifest run as the kubelet would run it, on this machine.

The container's args become the command (``inferpool`` is ``python -m inferpool``), its env
the environment (``resourceFieldRef`` values computed from its resources, as the kubelet
does), a volume's mount path a temporary folder, and each declared container port a free
port on 127.0.0.1 (an env value naming the port is rewritten with it), so that the server
runs with exactly the manifest's settings. Probes are HTTP GETs at their path and port.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from inferpool import __version__
from tests.support import free_port, wait_for_200

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# The image the manifests run: inferpool's, tagged with the project's version.
IMAGE = f"inferpool:{__version__}"


def image_instructions() -> dict[str, str]:
    """ENTRYPOINT, CMD and USER of the image's Dockerfile (its last stage's, the last ones)."""
    dockerfile = (DEPLOY.parent / "Dockerfile").read_text()
    return dict(re.findall(r"^(ENTRYPOINT|CMD|USER) (.+)$", dockerfile, re.M))


_QUANTITY = re.compile(r"([0-9.]+)(m|k|Ki|M|Mi|G|Gi|T|Ti)?")
_SUFFIX = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def load(name: str) -> list[dict[str, Any]]:
    """The documents of deploy/``name``."""
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d is not None]


def quantity(text: str | int) -> float:
    match = _QUANTITY.fullmatch(str(text))
    assert match, f"not a Kubernetes quantity: {text!r}"
    return float(match[1]) * _SUFFIX[match[2]]


def environment(
    container: dict[str, Any], pod: list[dict[str, Any]] | None = None
) -> dict[str, str]:
    """The container's variables as the kubelet sets them; a resourceFieldRef may name another
    of the ``pod``'s containers. fieldRef ones are left out: they name the pod, which does
    not exist here."""
    containers = {c["name"]: c for c in pod or [container]}
    values: dict[str, str] = {}
    for variable in container.get("env", []):
        if "value" in variable:
            values[variable["name"]] = variable["value"]
            continue
        source = variable["valueFrom"]
        if "fieldRef" in source:
            continue
        reference = source["resourceFieldRef"]
        target = containers[reference.get("containerName", container["name"])]
        scope, _, resource = reference["resource"].partition(".")
        amount = quantity(target["resources"][scope][resource])
        # The kubelet rounds up to a whole number of divisors (1 CPU: 1.5 -> 2).
        values[variable["name"]] = str(math.ceil(amount / quantity(reference.get("divisor", 1))))
    return values


@dataclass
class Pod:
    """One container of a manifest, localised: ``ports`` maps its container ports to the free
    ports the server listens on here, ``mounts`` its mount paths to local folders."""

    container: dict[str, Any]
    mounts: dict[str, Path]
    ports: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ports = {port["containerPort"]: free_port() for port in self.container["ports"]}
        self.named = {port["name"]: port["containerPort"] for port in self.container["ports"]}

    def local(self, text: str) -> str:
        for mount, folder in self.mounts.items():
            if text == mount or text.startswith(mount + "/"):
                return str(folder) + text[len(mount) :]
        return text

    def command(self) -> list[str]:
        args = self.container["args"]
        assert args[0] == "inferpool", args  # the image's console script
        return [sys.executable, "-m", "inferpool", *(self.local(a) for a in args[1:])]

    def environment(self) -> dict[str, str]:
        values = {}
        for name, value in environment(self.container).items():
            number = int(value) if value.isdigit() else None
            values[name] = str(self.ports[number]) if number in self.ports else self.local(value)
        # Only loopback here: the manifest's server listens on every address.
        return {**values, "INFERPOOL_HOST": "127.0.0.1"}

    def url(self, port: int | str, path: str = "") -> str:
        number = self.named[port] if isinstance(port, str) else port
        return f"http://127.0.0.1:{self.ports[number]}{path}"

    def probe_url(self, probe: str) -> str:
        action = self.container[probe]["httpGet"]
        return self.url(action["port"], action["path"])

    @contextmanager
    def running(self) -> Iterator[Server]:
        with tempfile.NamedTemporaryFile(prefix="inferpool-pod-", suffix=".log") as log:
            process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.environment()},
                start_new_session=True,  # its group: the workers go with it at the end
            )
            server = Server(process, Path(log.name))
            try:
                yield server
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, url: str, timeout: float = 120) -> httpx.Response:
        """Poll ``url`` as a probe does until it answers 200."""
        return wait_for_200(url, self.process, self.output, timeout)

    def terminate(self, grace: float) -> int:
        """SIGTERM, as the kubelet sends it; the exit code within ``grace`` seconds."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(grace)
        except subprocess.TimeoutExpired:
            message = f"still running {grace} s after SIGTERM:\n{self.output()}"
            raise AssertionError(message) from None
