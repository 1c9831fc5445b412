"""/metrics counts open sockets through psutil's ``net_connections`` (psutil 6) or, on the
psutil 5.9.x that kserve 0.21 requires, its older name ``connections``: either way the
server's own listening socket is found (tox's lowest environment runs the whole
/metrics suite on psutil 5.9.6)."""

from __future__ import annotations

import socket
from typing import Any

import psutil

from inferpool.frontends.metrics_server import tcp_connections


class OldPsutilProcess:
    """A psutil 5.9 process: ``connections`` only."""

    def __init__(self) -> None:
        self.process = psutil.Process()

    def connections(self, kind: str) -> list[Any]:
        read = getattr(self.process, "net_connections", None) or self.process.connections
        return list(read(kind=kind))


def listening_ports(connections: list[Any]) -> set[int]:
    return {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}


def test_both_psutil_names_find_the_listening_socket() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert port in listening_ports(tcp_connections(psutil.Process()))
        old = OldPsutilProcess()
        assert not hasattr(old, "net_connections")
        assert port in listening_ports(tcp_connections(old))  # type: ignore[arg-type]
