"""Ctrl-C at any moment of ``inferpool serve``'s start-up: a terminal sends SIGINT to the
whole foreground process group (the server, its template and workers). Before the server
is ready it exits 130 (128 + SIGINT, as shells report an interrupted command) without a
traceback from any of its processes; once ready, Ctrl-C is a shutdown like SIGTERM: the
drain, then exit 0 (tests/e2e/test_drain_signals.py)."""

from __future__ import annotations

import contextlib
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


def wait_until_mapped(server: Server, library: str, timeout: float = 60) -> None:
    """Until the server's process has loaded ``library`` (a shared object's name): a moment
    of its start-up named by what it imports, not by a delay a loaded machine stretches."""
    maps = Path(f"/proc/{server.process.pid}/maps")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if library in maps.read_text():
                return
        time.sleep(0.002)
    pytest.fail(f"{library} never loaded:\n{server.output()[-4000:]}")


# While the command line's settings build their pydantic models (CI once interrupted
# pydantic-core there: it wraps the KeyboardInterrupt in its own SchemaError), while numpy
# loads, and while the server starts its loop.
@pytest.mark.parametrize("library", ["_pydantic_core", "_multiarray_umath", "uvloop/loop"])
def test_ctrl_c_during_start_up_exits_130(iris_repo: Path, library: str) -> None:
    """The moments before the server's loop owns SIGINT: imports, settings, binding."""
    with Server(iris_repo, "--workers", "1", new_session=True) as server:
        wait_until_mapped(server, library)
        ctrl_c(server)
        try:
            code = server.wait_exit(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit 60 s after Ctrl-C:\n{server.output()[-4000:]}")
        assert code == 130, server.output()[-4000:]
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
