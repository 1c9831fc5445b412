"""A TCP relay that counts the bytes a server sends: what a real client received on the
wire (e.g. whether its answers came compressed), without looking inside the protocol."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self


class CountingRelay:
    """Listens on 127.0.0.1 (``port``) and forwards each connection to ``target_port``;
    ``received`` counts the bytes the target sent back, over every connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.received = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while data := source.recv(65536):
                if counted:
                    with self._lock:
                        self.received += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._listener.close()
