"""Crash blame: whose doing a worker's death was, and when a model is quarantined.

A worker records in its request ring what it is running, so its death is blamed on
that model, but only when the model caused it: a fatal signal the worker raised, an
error exit, or a SIGKILL by our cgroup's out-of-memory killer. An outside SIGKILL (an
operator, a test, a node agent) is not counted. ``CrashBook`` counts the model-caused
crashes per model and says when one reaches ``QUARANTINE_CRASHES`` in
``QUARANTINE_WINDOW`` seconds. ``ExitStatuses`` pairs the wait statuses the template
reports with the deaths waiting for them. Nothing here touches a process.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal

logger = logging.getLogger(__name__)

QUARANTINE_CRASHES, QUARANTINE_WINDOW = 3, 60.0


def oom_kills() -> int | None:
    """Processes of this cgroup (and below) the out-of-memory killer has killed so far.

    From cgroup v2's ``memory.events`` or v1's ``memory.oom_control`` (both count
    ``oom_kill``); None where neither can be read, and then no SIGKILL is taken for the
    model's doing.
    """
    try:
        with open("/proc/self/cgroup") as cgroup:
            entries = dict(line.strip().split(":", 2)[1:] for line in cgroup if ":" in line)
    except (OSError, ValueError):
        return None
    candidates = []
    if "memory" in entries:  # v1, or hybrid with the memory controller on v1
        candidates.append(f"/sys/fs/cgroup/memory{entries['memory']}/memory.oom_control")
    if "" in entries:
        candidates.append(f"/sys/fs/cgroup{entries[''].rstrip('/')}/memory.events")
    for path in candidates:
        try:
            with open(path) as counters:
                for line in counters:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def describe_exit(status: int | None) -> str:
    """A waitpid status in words: "killed by signal SIGSEGV", "exited with code 1"."""
    if status is None:
        return "exited"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"killed by signal {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return f"exited with code {os.WEXITSTATUS(status)}"


class CrashBook:
    """Model-caused crashes per model, in a sliding window."""

    def __init__(self) -> None:
        self._crashes: dict[str, collections.deque[float]] = {}
        self._oom_kills_seen = oom_kills() or 0

    def model_caused(self, status: int) -> bool:
        """Whether a worker's death was its model's doing, not someone else's.

        A fatal signal the process raised itself (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, ...)
        or an error exit is the model's. SIGKILL is anyone's (an operator, a test, a node
        agent) unless the out-of-memory killer of our cgroup sent it; SIGTERM and SIGINT
        come from outside.
        """
        if not os.WIFSIGNALED(status):
            return os.WEXITSTATUS(status) != 0
        number = os.WTERMSIG(status)
        if number == signal.SIGKILL:
            kills = oom_kills()
            caused = kills is not None and kills > self._oom_kills_seen
            if kills is not None:
                self._oom_kills_seen = kills
            return caused
        return number not in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def count(
        self, who: str, name: str, request_ids: list[int], status: int, now: float
    ) -> str | None:
        """Count ``who``'s death (``status``) while running model ``name`` against it.

        Returns the quarantine reason once the model's crashes reach ``QUARANTINE_CRASHES``
        in ``QUARANTINE_WINDOW`` seconds; a death from outside is logged, not counted.
        """
        how = describe_exit(status)
        if not self.model_caused(status):
            logger.error(
                "%s %s while running model '%s' (requests %s); killed from outside, "
                "not counted against the model", who, how, name, request_ids,
            )  # fmt: skip
            return None
        logger.error("%s %s while running model '%s' (requests %s)", who, how, name, request_ids)
        crashes = self._crashes.setdefault(name, collections.deque())
        crashes.append(now)
        while crashes and now - crashes[0] > QUARANTINE_WINDOW:
            crashes.popleft()
        if len(crashes) < QUARANTINE_CRASHES:
            return None
        return (
            f"quarantined: its requests crashed workers {len(crashes)} times "
            f"in {QUARANTINE_WINDOW:.0f} s: {how}"
        )

    def forget(self, name: str) -> None:
        """The model was loaded again or unloaded: its count starts over."""
        self._crashes.pop(name, None)


class ExitStatuses:
    """Wait statuses of reaped workers, by pid, for the deaths that wait to be blamed."""

    KEEP = 1024  # statuses nobody asked for: only the recent ones are kept

    def __init__(self) -> None:
        self._statuses: dict[int, int] = {}
        self._waiters: dict[int, asyncio.Future[int]] = {}

    def reported(self, pid: int, status: int) -> None:
        waiter = self._waiters.pop(pid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(status)
            return
        if len(self._statuses) > self.KEEP:
            self._statuses.clear()
        self._statuses[pid] = status

    def take(self, pid: int) -> int | None:
        """The status of ``pid`` if it was reported already."""
        return self._statuses.pop(pid, None)

    async def wait(self, pid: int, timeout: float) -> int | None:
        """The status of ``pid`` once reported; None if it is not within ``timeout``."""
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters[pid] = waiter
        try:
            return await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            return None
        finally:
            self._waiters.pop(pid, None)
