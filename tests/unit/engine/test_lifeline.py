"""The kernel mechanisms that end the server's children with it (``ipc/lifeline.py``):
the lifeline pipe (SIGKILL to each holder when its last writer is gone, busy or not) and
the prelude that sets the parent-death signal before a child imports anything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from inferpool.engine.ipc import lifeline

WAIT = 10.0  # seconds; each of these ends in milliseconds


def wait_status(pid: int, timeout: float = WAIT) -> tuple[int, float]:
    """The wait status of child ``pid`` and how long it took to end."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status, time.monotonic() - started
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} still running after {timeout}s")


def fork_holder(read_end: int, ready: int, write_end: int | None = None) -> int:
    """A child that holds the lifeline, says so, then spins (never reads anything); it
    closes its copy of ``write_end`` (a template or worker never has one)."""
    pid = os.fork()
    if pid == 0:
        try:
            if write_end is not None:
                os.close(write_end)
            lifeline.hold(read_end)
            os.write(ready, b"x")
            while True:
                pass
        finally:
            os._exit(3)
    return pid


def test_a_busy_holder_is_killed_when_the_last_write_end_closes() -> None:
    read_end, write_end = os.pipe()
    ready_in, ready_out = os.pipe()
    pid = fork_holder(read_end, ready_out, write_end)
    assert os.read(ready_in, 1) == b"x"  # armed, and spinning
    time.sleep(0.2)
    assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # an open write end keeps it alive
    os.close(write_end)
    status, took = wait_status(pid)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert took < 1.0
    for fd in (read_end, ready_in, ready_out):
        os.close(fd)


def test_a_holder_whose_writer_has_already_gone_exits_at_once() -> None:
    read_end, write_end = os.pipe()
    os.close(write_end)  # the server died before the child armed its lifeline
    ready_in, ready_out = os.pipe()
    pid = fork_holder(read_end, ready_out)
    status, _ = wait_status(pid)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1
    for fd in (read_end, ready_in, ready_out):
        os.close(fd)


def run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter that imports this inferpool, with ``tmp_path`` (where
    the module ``sleeper`` is) on its path."""
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(60)\n")
    path = os.pathsep.join([str(tmp_path), *(p or os.getcwd() for p in sys.path)])
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_forked_child_of_the_server_does_not_keep_the_write_end(tmp_path: Path) -> None:
    done = run(
        """
        import os
        from inferpool.engine.ipc import lifeline
        lifeline.read_end()
        write_end = lifeline._pipe[1]
        pid = os.fork()
        if pid == 0:
            try:
                os.fstat(write_end)
            except OSError:
                os._exit(0 if lifeline._pipe is None else 2)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        os.fstat(write_end)  # the server's own stays open
        print(os.waitstatus_to_exitcode(status))
        """,
        tmp_path,
    )
    assert done.stdout.strip() == "0", done.stderr


@pytest.mark.parametrize("parent_alive", [True, False], ids=["killed-later", "died-before"])
def test_the_prelude_ties_the_child_to_its_parent(tmp_path: Path, parent_alive: bool) -> None:
    """A middle process starts ``sleeper`` through ``lifeline.command`` and is then
    SIGKILLed: the sleeper dies with it. A parent pid that is not the child's parent (it
    died before the prctl) makes the child exit at once."""
    parent = "os.getpid()" if parent_alive else "1"
    # The child runs its prelude (alive: it is still running a second later); else it
    # exits, however slowly it starts (a loaded machine, coverage's start-up): waited for,
    # so that it does not outlive the middle process and find init its parent, as told.
    settle = "time.sleep(1.0)" if parent_alive else "child.wait(30)"
    done = run(
        f"""
        import os, subprocess, sys, time
        from inferpool.engine.ipc import lifeline
        env = {{**os.environ, lifeline.PARENT_ENV: str({parent})}}
        child = subprocess.Popen(lifeline.command("sleeper"), env=env)
        {settle}
        print(child.pid, child.poll(), flush=True)
        os.kill(os.getpid(), 9)
        """,
        tmp_path,
    )
    pid, code = done.stdout.split()
    if not parent_alive:
        assert code == "1", done.stderr
        return
    assert code == "None", done.stderr  # it was running until its parent died
    deadline = time.monotonic() + WAIT
    while running(int(pid)):
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.01)


def running(pid: int) -> bool:
    try:
        return ") Z " not in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
