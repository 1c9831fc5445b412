"""The ports servers are started on (``benchmarks.ports``): below the kernel's ephemeral
range, where no outgoing connection takes them, a slice for each pytest-xdist worker, and
only ports that can be bound."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import ports

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's walk started again, so that patched bounds and variables apply."""
    monkeypatch.setattr(ports, "_cursor", ports._Cursor())


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    (tmp_path / "range").write_text("41000\t61000\n")
    assert ports.ephemeral_low(tmp_path / "range") == 41000
    assert ports.ephemeral_low(tmp_path / "missing") is None
    (tmp_path / "range").write_text("")
    assert ports.ephemeral_low(tmp_path / "range") is None


def test_each_xdist_worker_has_its_own_slice() -> None:
    pool = range(20000, 32768)
    env = {"PYTEST_XDIST_WORKER_COUNT": "2"}
    first = ports.worker_slice(pool, {**env, "PYTEST_XDIST_WORKER": "gw0"})
    second = ports.worker_slice(pool, {**env, "PYTEST_XDIST_WORKER": "gw1"})
    assert len(first) == len(second) == len(pool) // 2
    assert not set(first) & set(second)
    assert set(first) | set(second) <= set(pool)
    assert ports.worker_slice(pool, {}) == pool
    three = [
        ports.worker_slice(
            pool, {"PYTEST_XDIST_WORKER_COUNT": "3", "PYTEST_XDIST_WORKER": f"gw{i}"}
        )
        for i in range(3)
    ]
    assert sum(len(s) for s in three) == len(set().union(*map(set, three))) == len(pool) // 3 * 3


@pytest.mark.skipif(ports.ephemeral_low() is None, reason="no ephemeral range to read")
def test_ports_come_from_below_the_ephemeral_range_and_this_workers_slice() -> None:
    """The regression: CI's "Address already in use" on 127.0.0.1:40037, a port the kernel
    handed out from the ephemeral range, where the other worker's clients took it."""
    low = ports.ephemeral_low()
    assert low is not None
    mine = ports.worker_slice(range(ports.FIRST_PORT, low))
    given = [ports.free_port() for _ in range(200)]
    assert all(port in mine for port in given), sorted(set(given) - set(mine))[:5]
    assert len(set(given)) == len(given)
    assert all(ports.bindable(port) for port in given)


def _two_bindable_ports() -> int:
    """``p`` such that ``p`` and ``p + 1`` can both be bound."""
    for _ in range(100):
        port = ports.free_port()
        if ports.bindable(port + 1):
            return port
    raise AssertionError("no two neighbouring free ports")


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    first = _two_bindable_ports()
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    monkeypatch.setattr(ports, "FIRST_PORT", first)
    monkeypatch.setattr(ports, "ephemeral_low", lambda: first + 2)
    monkeypatch.setattr(ports, "_cursor", ports._Cursor())
    with socket.socket() as held:
        held.bind((ports.HOST, first))
        held.listen()
        assert {ports.free_port() for _ in range(10)} == {first + 1}
        with socket.socket() as also_held:
            also_held.bind((ports.HOST, first + 1))
            # Both taken: the kernel's choice, which is free.
            port = ports.free_port()
            assert port not in (first, first + 1)
            assert ports.bindable(port)


def test_without_a_range_below_the_ephemeral_one_the_kernel_chooses(
    monkeypatch: pytest.MonkeyPatch, fresh_cursor: None
) -> None:
    monkeypatch.setattr(ports, "ephemeral_low", lambda: None)
    assert ports.bindable(ports.free_port())
    monkeypatch.setattr(ports, "_cursor", ports._Cursor())
    monkeypatch.setattr(ports, "ephemeral_low", lambda: ports.FIRST_PORT)
    assert ports.bindable(ports.free_port())


@pytest.mark.skipif(ports.ephemeral_low() is None, reason="no ephemeral range to read")
def test_a_process_started_by_a_test_walks_its_workers_slice_from_elsewhere() -> None:
    """The harness started by a benchmark test inherits the worker's variables: the same
    slice, from another random place."""
    low = ports.ephemeral_low()
    assert low is not None
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"}
    code = "from benchmarks.ports import free_port; print(*(free_port() for _ in range(5)))"
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for _ in range(2)
    ]
    slice_ = ports.worker_slice(range(ports.FIRST_PORT, low), env)
    assert all(int(port) in slice_ for run in runs for port in run)
    assert runs[0] != runs[1]


def test_a_port_base_gives_each_server_three_ports_in_turn() -> None:
    plan = ports.plan_from(21000, ["mlserver-w0", "inferpool-w2"])
    assert plan == {
        "mlserver-w0": ports.ServerPorts(http=21000, grpc=21001, metrics=21002),
        "inferpool-w2": ports.ServerPorts(http=21003, grpc=21004, metrics=21005),
    }
    with pytest.raises(ValueError, match="65534-65539 are not all valid ports"):
        ports.plan_from(65534, ["a", "b"])
    with pytest.raises(ValueError, match="not all valid"):
        ports.plan_from(0, ["a"])


def test_a_busy_port_of_the_plan_is_named_before_any_server_starts() -> None:
    first = _two_bindable_ports()
    plan = {"inferpool-w0": ports.ServerPorts(first, first + 1, first + 1)}
    ports.check_free(plan)  # both free: no error
    with socket.socket() as held:
        held.bind((ports.HOST, first + 1))
        held.listen()
        with pytest.raises(ports.PortBusy) as refused:
            ports.check_free(plan)
    assert str(refused.value) == (
        f"port {first + 1} (inferpool-w0's gRPC port, from --port-base) is in use on "
        "127.0.0.1: free it or choose another --port-base"
    )
