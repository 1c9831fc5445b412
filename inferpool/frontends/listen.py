"""Listening sockets for every frontend, bound before serving so a taken port fails early."""

from __future__ import annotations

import socket


def bind_socket(host: str, port: int, purpose: str = "") -> socket.socket:
    """A listening TCP socket; an OSError says which address is taken (and for what)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        what = f" for {purpose}" if purpose else ""
        raise OSError(f"cannot listen on {host}:{port}{what}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock
