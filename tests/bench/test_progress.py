"""A run's progress: rich's bar on a terminal, one plain line per step anywhere else (a CI
log, a pipe), each saying how far the run is and how long it has left."""

from __future__ import annotations

import io

from rich.console import Console

from benchmarks import progress


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_count_units_and_measure_the_pace_after_the_first() -> None:
    out, clock = io.StringIO(), Clock()
    plain = progress.PlainProgress(out, total=4, unit_seconds=5.0, clock=clock)
    with plain:
        plain.step("building the model repository")
        clock.now += 40  # set-up: says nothing of the pace
        plain.step("iris/b1/rest-json/c64 on inferpool-w2: repetition 1/2")
        clock.now += 3
        plain.advance(1)
        plain.step("iris/b1/rest-json/c64 on inferpool-w0: repetition 2/2")
        clock.now += 2
        plain.advance(1)  # a unit per 2 s since the first: 4 s left for two
        plain.step("iris/b1/rest-json/c64 on inferpool-w2: repetition 2/2")
        clock.now += 2
        plain.advance(2)
    assert out.getvalue().splitlines() == [
        "[0/4 0%, elapsed 0:00, eta 0:20] building the model repository",
        "[0/4 0%, elapsed 0:40, eta 0:20] iris/b1/rest-json/c64 on inferpool-w2: repetition 1/2",
        "[1/4 25%, elapsed 0:43, eta 0:15] iris/b1/rest-json/c64 on inferpool-w0: repetition 2/2",
        "[2/4 50%, elapsed 0:45, eta 0:04] iris/b1/rest-json/c64 on inferpool-w2: repetition 2/2",
        "[4/4 100%, elapsed 0:47, eta 0:00] done",
    ]


def test_clock_text() -> None:
    assert progress.clock_text(None) == "?"
    assert progress.clock_text(61.4) == "1:01"
    assert progress.clock_text(3725) == "1:02:05"


def test_not_on_a_terminal_each_step_is_a_line_without_control_codes() -> None:
    console = Console(file=io.StringIO())  # a pipe, as in CI
    reporter = progress.for_console(console, total=2, unit_seconds=1.0)
    assert isinstance(reporter, progress.PlainProgress)
    with reporter:
        reporter.step("lightgbm/b256/grpc-raw/c8 on inferpool-w0: repetition 1/1")
        reporter.advance(2)
    text = console.file.getvalue()
    assert "\x1b" not in text and "\r" not in text
    assert text.splitlines()[0].endswith(
        "lightgbm/b256/grpc-raw/c8 on inferpool-w0: repetition 1/1"
    )
    assert text.splitlines()[-1].startswith("[2/2 100%")


def test_on_a_terminal_a_bar_shows_the_step_its_count_and_eta() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    reporter = progress.for_console(console, total=4, unit_seconds=1.0)
    assert isinstance(reporter, progress.BarProgress)
    with reporter:
        reporter.step("iris/b1/grpc-raw/c64 on mlserver-w0: repetition 2/2")
        reporter.advance(3)
        reporter.bar.refresh()
        drawn = console.file.getvalue()
    assert "\x1b[" in drawn  # redrawn in place: cursor control codes
    assert "iris/b1/grpc-raw/c64 on mlserver-w0: repetition 2/2" in drawn
    assert "3/4" in drawn and "eta" in drawn and "━" in drawn
