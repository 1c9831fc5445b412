"""Ctrl-C at any moment of ``inferpool serve``'s start-up: a terminal sends SIGINT to the
whole foreground process group (the server, its template and workers). Before the server
is ready it exits 130 (128 + SIGINT, as shells report an interrupted command) without a
traceback from any of its processes; once ready, Ctrl-C is a shutdown like SIGTERM: the
drain, then exit 0 (tests/e2e/test_drain_signals.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support import Server, write_custom_model

SLOW_LOAD = """
import time

from inferpool import Runtime


class SlowLoad(Runtime):
    def load(self):
        time.sleep(30)

    def predict(self, payload, outputs):
        return payload
"""


@pytest.fixture(scope="module")
def slow_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slow-load")
    write_custom_model(root / "slow", SLOW_LOAD, "SlowLoad")
    return root


def ctrl_c(server: Server) -> None:
    os.killpg(os.getpgid(server.process.pid), signal.SIGINT)


def assert_quiet(server: Server) -> None:
    output = server.output()
    assert "Traceback" not in output and "Error" not in output, output[-4000:]


def test_ctrl_c_right_away_exits_130(iris_repo: Path) -> None:
    """While Python imports inferpool, reads the settings, binds (the moments before the
    server's loop owns SIGINT)."""
    for delay in (0.4, 1.2):
        with Server(iris_repo, "--workers", "1", new_session=True) as server:
            time.sleep(delay)
            ctrl_c(server)
            try:
                code = server.wait_exit(60)
            except subprocess.TimeoutExpired:
                pytest.fail(f"no exit 60 s after Ctrl-C at {delay} s:\n{server.output()[-4000:]}")
            # Before inferpool's own handler is installed (a loaded machine: Python is still
            # importing), Python's KeyboardInterrupt ends the interpreter by SIGINT itself:
            # a shell shows that as 130 too.
            assert code in (130, -signal.SIGINT), server.output()[-4000:]
            assert_quiet(server)


def test_ctrl_c_while_a_model_loads_exits_130(slow_repository: Path) -> None:
    """Listening, a worker loading a model (its template preloading it first)."""
    args = ("--workers", "1", "--shutdown-timeout", "5")
    with Server(slow_repository, *args, new_session=True) as server:
        server.wait_live()
        deadline = time.monotonic() + 60
        state = None
        while time.monotonic() < deadline and state != "LOADING":
            state = httpx.get(f"{server.url}/v2/models/slow", timeout=5).json().get("state")
            time.sleep(0.05)
        assert state == "LOADING"
        ctrl_c(server)
        assert server.wait_exit(60) == 130, server.output()[-4000:]
        assert_quiet(server)


def test_ctrl_c_once_ready_is_a_clean_shutdown(iris_repo: Path) -> None:
    with Server(iris_repo, "--workers", "1", new_session=True) as server:
        server.wait_ready()
        ctrl_c(server)
        assert server.wait_exit(60) == 0, server.output()[-4000:]
        assert_quiet(server)
