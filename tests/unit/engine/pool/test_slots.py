"""The pieces the pool's fault handling stands on, without processes.

The slot header refuses what it cannot carry (before anything is registered), the
ring's running record tells which group runs, exit statuses read as words, and
liveness only reports a wedged pool.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from inferpool.engine.ipc import messages
from inferpool.engine.ipc.ring import RUNNING_IDS, Ring, create_ring_fd
from inferpool.engine.pool import crashes
from inferpool.engine.pool.crashes import CrashBook, describe_exit
from inferpool.engine.pool.outages import WEDGED_AFTER
from inferpool.engine.pool.pool import PoolClient
from inferpool.settings import ServerSettings


@pytest.mark.parametrize(
    ("json_length", "deadline"),
    [
        (2**63, None),  # an Inference-Header-Content-Length beyond int64
        (2**70, None),
        (-1, None),
        (11, None),  # longer than the 10-byte body
        (None, float("inf")),
        (None, float("-inf")),
        (None, float("nan")),
        (None, -5.0),
    ],
)
def test_a_header_it_cannot_carry_is_a_value_error(json_length, deadline) -> None:
    with pytest.raises((ValueError, OverflowError)):
        messages.request_header(1, 1, 0, json_length, deadline, 10)


def test_a_deadline_centuries_away_is_no_deadline() -> None:
    far = time.monotonic() + 2562047 * 3600  # grpc-timeout 2562047H, grpc-go's largest
    unpack = messages.RequestHeader.unpack_from
    header = unpack(messages.request_header(7, 2, 1, None, far, 10))
    assert header.deadline_ns in (0, int(far * 1e9))  # packs (fits in int64 on a young clock)
    header = unpack(messages.request_header(7, 2, 1, None, 1e10, 10))
    assert header.deadline_ns == 0  # beyond int64 nanoseconds
    near = time.monotonic() + 5
    header = unpack(messages.request_header(7, 2, 1, 10, near, 10))
    assert header.json_length == 10 and header.deadline_ns == int(near * 1e9)


def test_the_running_record_crosses_mappings() -> None:
    fd = create_ring_fd(4, 256)
    try:
        worker_side, frontend_side = Ring(fd, 4, 256), Ring(fd, 4, 256)
    finally:
        os.close(fd)
    assert frontend_side.running() is None
    worker_side.mark_running(3, [41], 123)
    assert frontend_side.running() == (3, [41], 123)
    many = list(range(100, 100 + RUNNING_IDS + 3))
    worker_side.mark_running(5, many, 456)
    assert frontend_side.running() == (5, many[:RUNNING_IDS], 456)
    worker_side.mark_idle()
    assert frontend_side.running() is None
    # The record does not disturb the ring itself.
    header = messages.request_header(1, 1, 0, None, None, 3)
    assert frontend_side.push(header, b"abc")
    assert [(f[0], body) for f, body in worker_side.pop_all()] == [(1, b"abc")]
    assert frontend_side.pending() == 0 and worker_side.pending() == 0


def test_exit_statuses_in_words() -> None:
    assert describe_exit(signal.SIGSEGV) == "killed by signal SIGSEGV"
    assert describe_exit(signal.SIGKILL) == "killed by signal SIGKILL"
    assert describe_exit(3 << 8) == "exited with code 3"
    assert describe_exit(None) == "exited"


def test_live_while_draining_not_live_only_when_wedged() -> None:
    client = PoolClient(ServerSettings(workers=2))
    assert client.live and client.live_reason() is None
    client.begin_shutdown()  # no running loop here: nothing to schedule
    assert client.live  # draining is not dead: Kubernetes must not restart it
    now = time.monotonic()
    outages = client.supervisor.outages
    outages.worker_died(1, quick=False, now=now - WEDGED_AFTER - 5)
    outages.worker_failed(1, "worker 1 exited while starting")
    client.supervisor.watchdog.check_wedged(now)
    assert not client.live and client.wedged == client.live_reason()
    reason = client.live_reason()
    assert reason is not None
    assert reason.startswith("worker 1 could not be started for 6") and "exited while" in reason
    outages.worker_up(1)
    client.supervisor.watchdog.check_wedged(now)
    assert client.live


def test_a_restarted_template_that_stays_up_is_live() -> None:
    client = PoolClient(ServerSettings(workers=2))
    now = time.monotonic()
    outages = client.supervisor.outages
    outages.template_gone(now - WEDGED_AFTER - 1)
    client.supervisor.watchdog.check_wedged(now)  # still down: not live
    assert not client.live
    assert "template process could not be restarted" in (client.live_reason() or "")
    outages.template_up(now - 5)  # restarted, not long enough ago to trust it
    assert outages.wedged(now, template_running=True) is not None
    outages.template_up(now - 11)  # restarted long enough ago, no worker needed since
    assert outages.wedged(now, template_running=True) is None
    client.supervisor.watchdog.check_wedged(now)
    assert client.live


def _signalled(number: int) -> int:
    """A waitpid status of a process killed by signal ``number``."""
    return number


def _exited(code: int) -> int:
    return code << 8


def test_only_deaths_the_model_caused_count_against_it(monkeypatch) -> None:
    kills = [4]
    monkeypatch.setattr(crashes, "oom_kills", lambda: kills[0])
    book = CrashBook()
    assert book.model_caused(_signalled(signal.SIGSEGV))
    assert book.model_caused(_signalled(signal.SIGABRT))
    assert book.model_caused(_exited(1))
    assert not book.model_caused(_exited(0))
    assert not book.model_caused(_signalled(signal.SIGTERM))
    # SIGKILL from outside (an operator, a test): the cgroup's OOM kills did not move.
    assert not book.model_caused(_signalled(signal.SIGKILL))
    # SIGKILL by the out-of-memory killer: the count rose.
    kills[0] = 5
    assert book.model_caused(_signalled(signal.SIGKILL))
    assert not book.model_caused(_signalled(signal.SIGKILL))  # that one is counted once
    # Where the counter cannot be read, a SIGKILL is never blamed on the model.
    monkeypatch.setattr(crashes, "oom_kills", lambda: None)
    assert not book.model_caused(_signalled(signal.SIGKILL))


def test_the_oom_counter_is_read_from_this_machines_cgroup() -> None:
    if not os.path.exists("/sys/fs/cgroup/memory") and not os.path.exists(
        "/sys/fs/cgroup/cgroup.controllers"
    ):
        pytest.skip("no memory cgroup mounted here")
    kills = crashes.oom_kills()
    # The project's machines (and CI's) have one: cgroup v1's memory.oom_control or v2's
    # memory.events; the count is a number.
    assert isinstance(kills, int) and kills >= 0
