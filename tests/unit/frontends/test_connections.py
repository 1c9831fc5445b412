"""The shared connection registry: the cap, eviction of the longest idle, refusal when busy."""

from __future__ import annotations

import resource
import subprocess
import sys

from inferpool.frontends.connections import FD_RESERVE, Connections
from inferpool.frontends.metrics_server import REJECTED


class Fake:
    frontend = "rest"

    def __init__(self, idle_since: float | None) -> None:
        self.idle_since = idle_since
        self.closed = False

    def close_idle(self) -> None:
        self.closed = True


def test_under_the_cap_every_connection_is_admitted():
    registry = Connections(3)
    conns = [Fake(1.0), Fake(None), Fake(2.0)]
    assert all(registry.admit(c) for c in conns)
    assert registry.open == set(conns)
    assert not any(c.closed for c in conns)


def test_at_the_cap_the_longest_idle_connection_makes_room():
    registry = Connections(3)
    busy, newer, older = Fake(None), Fake(20.0), Fake(10.0)
    for conn in (busy, newer, older):
        registry.admit(conn)
    newcomer = Fake(30.0)
    assert registry.admit(newcomer)
    assert older.closed and not newer.closed and not busy.closed
    assert registry.open == {busy, newer, newcomer}
    assert registry.evicted == 1


def test_when_every_connection_is_busy_the_new_one_is_refused():
    registry = Connections(2)
    a, b = Fake(None), Fake(None)
    registry.admit(a)
    registry.admit(b)
    newcomer = Fake(5.0)
    counted = REJECTED["rest", "max_connections"]
    assert not registry.admit(newcomer)
    assert registry.refused == 1
    assert REJECTED["rest", "max_connections"] == counted + 1  # the metrics' count
    assert newcomer not in registry.open and not a.closed and not b.closed
    # Once one closes, there is room again.
    registry.release(a)
    assert registry.admit(newcomer)


def test_release_is_idempotent():
    registry = Connections(2)
    conn = Fake(1.0)
    registry.admit(conn)
    registry.release(conn)
    registry.release(conn)
    assert not registry.open


def test_the_cap_keeps_a_reserve_of_file_descriptors():
    assert Connections(4096, fd_limit=1024).limit == 1024 - FD_RESERVE
    assert Connections(100, fd_limit=1 << 20).limit == 100
    assert Connections(4096, fd_limit=100).limit == 16  # never zero


def test_raise_fd_limit_lifts_the_soft_limit_to_the_hard_one():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = (
        "import resource\n"
        "from inferpool.frontends.connections import raise_fd_limit\n"
        "print(raise_fd_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard)),
    ).stdout.split()
    returned, now = int(out[0]), int(out[1])
    assert returned == now
    expected = hard if hard != resource.RLIM_INFINITY else 1 << 20
    assert now == expected
