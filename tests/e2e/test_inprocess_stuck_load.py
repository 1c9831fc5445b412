"""``--workers 0``: a model whose ``load()`` never returns must not keep the server from
exiting on SIGTERM (the load runs in a thread of the server process, which Python would
otherwise wait for at exit)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.support import Server, write_custom_model

STUCK = """
import threading

from inferpool import Runtime


class Stuck(Runtime):
    def load(self):
        threading.Event().wait()  # never set

    def predict(self, payload, outputs):
        return payload
"""


def test_sigterm_ends_a_server_whose_model_load_never_returns(tmp_path: Path) -> None:
    write_custom_model(tmp_path / "stuck", STUCK, "Stuck")
    with Server(tmp_path, "--workers", "0", "--no-exit-on-error") as server:
        server.wait_live()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = httpx.get(f"{server.url}/v2/models/stuck").json().get("state")
            if state == "LOADING":
                break
            time.sleep(0.05)
        assert state == "LOADING"
        assert server.stop(timeout=20) == 0
