"""Free ports for the servers that benchmarks and tests start, chosen so that they do not
collide.

A port from ``bind(port 0)`` is free only until the socket closes, and it comes from the
kernel's ephemeral range, the range every outgoing connection's local port also comes from.
Between the check and the server's own ``bind``, a client of another test process can take
it (CI saw "Address already in use" on 127.0.0.1:40037 under ``pytest -n 2``). So ports come
from below the ephemeral range, where no connection is given a local port, and each pytest-
xdist worker walks its own slice of that range from a random place: two workers never hand
out the same port, and a port is handed out only if it can be bound now.

``--port-base N`` replaces that choice with a plan: the servers' ports from N upwards, all
checked before the first server starts.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass
from pathlib import Path

HOST = "127.0.0.1"
# Ray gives its workers ports 10002-19999 by default (tox -e ray starts inferpool beside it).
FIRST_PORT = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_low(path: Path = EPHEMERAL_RANGE) -> int | None:
    """The first port of the kernel's ephemeral range, or None where it cannot be read."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def worker_slice(ports: range, environ: dict[str, str] | os._Environ[str] = os.environ) -> range:
    """This pytest-xdist worker's share of ``ports`` (all of them outside xdist). A process
    started by a test inherits its worker's variables, and so its slice."""
    name = environ.get("PYTEST_XDIST_WORKER", "")
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    count = max(1, int(environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    size = len(ports) // count
    return ports[index * size : (index + 1) * size] if index < count else range(0)


def bindable(port: int, host: str = HOST) -> bool:
    """Whether a listening socket could take ``port`` now (without SO_REUSEADDR, so that a
    port still in TIME_WAIT is passed over too)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _walk(ports: range) -> Iterator[int]:
    """Round ``ports`` from a random place: processes sharing a slice (a test and the
    harness it starts) start far apart."""
    start = random.SystemRandom().randrange(len(ports))
    while True:
        for offset in range(len(ports)):
            yield ports[(start + offset) % len(ports)]


class _Cursor:
    """The process's walk over its slice, started again after a fork."""

    def __init__(self) -> None:
        self.pid = -1
        self.ports = range(0)
        self.walk: Iterator[int] = iter(())

    def candidates(self) -> tuple[range, Iterator[int]]:
        if self.pid != os.getpid():
            self.pid = os.getpid()
            low = ephemeral_low()
            self.ports = worker_slice(range(FIRST_PORT, low)) if low else range(0)
            self.walk = _walk(self.ports) if self.ports else iter(())
        return self.ports, self.walk


_cursor = _Cursor()


def free_port(host: str = HOST) -> int:
    """A port no other server of this run is given and that can be bound now; the kernel's
    choice only where no range below the ephemeral one exists (not Linux, or a range that
    starts at or below 20000)."""
    ports, walk = _cursor.candidates()
    for port in itertools.islice(walk, len(ports)):
        if bindable(port, host):
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class ServerPorts:
    """The three ports one managed server listens on."""

    http: int
    grpc: int
    metrics: int

    @classmethod
    def free(cls, host: str = HOST) -> ServerPorts:
        """Three ports from :func:`free_port` (the harness's automatic choice)."""
        return cls(free_port(host), free_port(host), free_port(host))


# The order a server's ports take from its block, for --port-base's messages.
PORT_ROLES = ("REST", "gRPC", "metrics")


class PortBusy(RuntimeError):
    """A port of a ``--port-base`` plan cannot be bound: the message names it and its user."""


def plan_from(base: int, servers: Sequence[str]) -> dict[str, ServerPorts]:
    """``--port-base``: each server in turn takes the next three ports from ``base``
    upwards (REST, gRPC, metrics), so that a firewall rule or a client set up beforehand
    knows where each server will be."""
    last = base + len(PORT_ROLES) * len(servers) - 1
    if base < 1 or last > 65535:
        raise ValueError(f"--port-base {base}: the ports {base}-{last} are not all valid ports")
    return {
        name: ServerPorts(*(base + len(PORT_ROLES) * i + k for k in range(len(PORT_ROLES))))
        for i, name in enumerate(servers)
    }


def check_free(plan: dict[str, ServerPorts], host: str = HOST) -> None:
    """Raise :class:`PortBusy` naming the first port of ``plan`` that cannot be bound now,
    before any server starts (a server would otherwise die minutes into a run, after the
    models were trained)."""
    for name, block in plan.items():
        for role, port in zip(PORT_ROLES, astuple(block), strict=True):
            if not bindable(port, host):
                raise PortBusy(
                    f"port {port} ({name}'s {role} port, from --port-base) is in use on "
                    f"{host}: free it or choose another --port-base"
                )
