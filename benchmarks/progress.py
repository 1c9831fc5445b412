"""How a run shows its progress: a rich progress bar (the current step: scenario, server,
repetition; done/total, elapsed, ETA) on a terminal, one plain line per step elsewhere.

A CI log or a pipe has no terminal: a bar redrawn in place would either vanish or fill the
log with control codes, so there each step is a line that says how far the run is and how
long it has left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Self

if TYPE_CHECKING:
    from types import TracebackType

    from rich.console import Console
    from rich.progress import Progress, TaskID


def clock_text(seconds: float | None) -> str:
    """``m:ss`` (``h:mm:ss`` past an hour), or ``?`` when unknown."""
    if seconds is None:
        return "?"
    minutes, secs = divmod(max(0, round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Reporter:
    """A context that shows a run's steps (``step``) and counts its units (``advance``)."""

    def step(self, text: str) -> None:
        raise NotImplementedError

    def advance(self, units: int) -> None:
        raise NotImplementedError

    def begin(self) -> None:
        """Called on entering the context."""

    def end(self, completed: bool) -> None:
        """Called on leaving it; ``completed`` is False when an exception is leaving."""

    def __enter__(self) -> Self:
        self.begin()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.end(kind is None)


class PlainProgress(Reporter):
    """One line per step: ``[done/total pct, elapsed m:ss, eta m:ss] step``.

    The ETA is the remaining units at the pace measured since the first unit was done
    (what comes before, training the models and starting the servers, is no measure of
    the pace); until a second one is done, at ``unit_seconds``, the pace the settings
    promise.
    """

    def __init__(
        self,
        out: IO[str],
        total: int,
        unit_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out
        self.total = total
        self.unit_seconds = unit_seconds
        self.clock = clock
        self.started = clock()
        self.done = 0
        self._first: tuple[float, int] | None = None  # (time, done) at the first advance

    def eta(self) -> float | None:
        remaining = max(0, self.total - self.done)
        if self._first is not None and self.done > self._first[1]:
            since, done_then = self._first
            return remaining * (self.clock() - since) / (self.done - done_then)
        return remaining * self.unit_seconds

    def step(self, text: str) -> None:
        percent = 100 * self.done / self.total if self.total else 100.0
        elapsed = clock_text(self.clock() - self.started)
        head = f"[{self.done}/{self.total} {percent:.0f}%, elapsed {elapsed}, "
        self.out.write(f"{head}eta {clock_text(self.eta())}] {text}\n")
        self.out.flush()  # a CI log shows each line as it comes

    def advance(self, units: int) -> None:
        self.done += units
        if self._first is None:  # the pace is measured from the end of the first unit
            self._first = (self.clock(), self.done)

    def end(self, completed: bool) -> None:
        if completed:
            self.step("done")


class BarProgress(Reporter):
    """rich's progress bar: the current step, a bar, done/total, elapsed and remaining time."""

    def __init__(self, console: Console, total: int) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar: Progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.task: TaskID = self.bar.add_task("setting up", total=total)

    def step(self, text: str) -> None:
        self.bar.update(self.task, description=text)

    def advance(self, units: int) -> None:
        self.bar.advance(self.task, units)

    def begin(self) -> None:
        self.bar.start()

    def end(self, completed: bool) -> None:
        self.bar.stop()


def for_console(console: Console, total: int, unit_seconds: float) -> Reporter:
    """The bar on a terminal, plain lines on whatever else ``console`` writes to."""
    if console.is_terminal:
        return BarProgress(console, total)
    return PlainProgress(console.file, total, unit_seconds)
