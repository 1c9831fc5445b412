"""Outages: how long the template process or a worker slot has been down, and what follows.

While processes keep dying soon after they start, the next start backs off (0.1 s,
doubling, capped at ``MAX_BACKOFF``; never giving up). When one could not be started
for ``WEDGED_AFTER`` seconds the process is wedged: liveness fails with the reason, so
Kubernetes restarts it. ``Outages`` holds this bookkeeping; it starts nothing itself.
"""

from __future__ import annotations

# A process that dies this soon after starting backs its next start off.
CRASH_WINDOW, MAX_BACKOFF = 10.0, 30.0
# Not live: no worker (or no template) could be started for this long.
WEDGED_AFTER = 60.0


def backoff(failures: int, first: float = 0.05) -> float:
    """The delay before the next start after ``failures`` quick failures in a row."""
    return first if failures == 0 else min(MAX_BACKOFF, 0.1 * 2 ** (failures - 1))


class Outages:
    """Per worker slot and for the template: since when down, why, and the back-off."""

    def __init__(self, slots: int) -> None:
        self.quick_deaths = [0] * slots  # quick deaths in a row, per slot (back-off)
        self.down_since: list[float | None] = [None] * slots
        self.start_errors = [""] * slots
        self.template_down_since: float | None = None  # until a worker starts again
        self.template_started = 0.0
        self.template_crashes = 0  # quick deaths in a row (back-off)

    # -- worker slots ------------------------------------------------------------------------
    def worker_died(self, slot: int, quick: bool, now: float) -> None:
        """The worker in ``slot`` died; ``quick``: soon after starting, with nothing to blame."""
        self.quick_deaths[slot] = self.quick_deaths[slot] + 1 if quick else 0
        if self.down_since[slot] is None:
            self.down_since[slot] = now

    def worker_delay(self, slot: int, attempt: int) -> float:
        """The wait before start ``attempt`` (0, 1, ...) of a replacement in ``slot``."""
        return backoff(self.quick_deaths[slot] + attempt)

    def worker_failed(self, slot: int, error: str) -> None:
        self.start_errors[slot] = error

    def worker_up(self, slot: int) -> None:
        self.down_since[slot] = None
        self.start_errors[slot] = ""

    # -- the template ------------------------------------------------------------------------
    def template_up(self, now: float) -> None:
        self.template_started = now

    def template_gone(self, now: float) -> None:
        if self.template_down_since is None:
            self.template_down_since = now

    def template_delay(self, now: float) -> float:
        """The template was reaped: the delay before restarting it."""
        quick = now - self.template_started < CRASH_WINDOW
        self.template_crashes = self.template_crashes + 1 if quick else 0
        return backoff(self.template_crashes, first=0.0)

    def template_works(self) -> None:
        """A worker started: the template forks again."""
        self.template_down_since = None

    # -- liveness ----------------------------------------------------------------------------
    def wedged(self, now: float, template_running: bool) -> str | None:
        """Why the process is not live (every outage past ``WEDGED_AFTER``), or None."""
        if (
            self.template_down_since is not None
            and template_running
            and now - self.template_started > CRASH_WINDOW
        ):
            self.template_down_since = None  # restarted, and it stays up
        reasons = []
        since = self.template_down_since
        if since is not None and now - since > WEDGED_AFTER:
            reasons.append(
                f"the worker template process could not be restarted for {now - since:.0f}s"
            )
        for slot, since in enumerate(self.down_since):
            if since is not None and now - since > WEDGED_AFTER:
                error = self.start_errors[slot]
                reasons.append(
                    f"worker {slot} could not be started for {now - since:.0f}s"
                    + (f": {error}" if error else "")
                )
        return "; ".join(reasons) or None
