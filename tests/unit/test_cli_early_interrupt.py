"""Ctrl-C before the server's loop owns SIGINT exits 130 quietly even when an extension
turned the KeyboardInterrupt into its own error (pydantic-core wraps one raised while it
builds a model class into a SchemaError: CI saw exit 1 and a traceback)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from inferpool import cli


@pytest.fixture(autouse=True)
def _restore_sigint() -> Iterator[None]:
    yield
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupted_inside_an_extension(argv: object) -> int:
    try:
        _ctrl_c()
    except KeyboardInterrupt:
        raise RuntimeError("Error building `literal` serializer: KeyboardInterrupt") from None
    raise AssertionError("SIGINT did not interrupt")


def test_a_wrapped_keyboard_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_run", _interrupted_inside_an_extension)
    assert cli.main([]) == cli.EXIT_INTERRUPTED


def test_a_swallowed_keyboard_interrupt_still_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused_after_the_interrupt(argv: object) -> int:
        try:
            _interrupted_inside_an_extension(argv)
        except RuntimeError:
            return cli.EXIT_USAGE
        return 0

    monkeypatch.setattr(cli, "_run", refused_after_the_interrupt)
    assert cli.main([]) == cli.EXIT_INTERRUPTED


def test_errors_without_an_interrupt_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(argv: object) -> int:
        raise RuntimeError("a real bug")

    monkeypatch.setattr(cli, "_run", broken)
    with pytest.raises(RuntimeError, match="a real bug"):
        cli.main([])
    monkeypatch.setattr(cli, "_run", lambda argv: 3)
    assert cli.main([]) == 3


def _ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    signal.sigtimedwait([], 0)  # the handler has run by the next bytecode


def test_while_imports_run_a_ctrl_c_waits_for_their_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not raised inside an extension's import (pyo3 prints a panic for one); raised as
    the deferred step ends, so that nothing after it runs."""
    steps: list[str] = []

    def importing(argv: object) -> int:
        with cli._interrupts_deferred():
            _ctrl_c()
            steps.append("the import finished")
        steps.append("served")
        return 0

    monkeypatch.setattr(cli, "_run", importing)
    assert cli.main([]) == cli.EXIT_INTERRUPTED
    assert steps == ["the import finished"]


def test_a_second_ctrl_c_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    steps: list[str] = []

    def hung_import(argv: object) -> int:
        with cli._interrupts_deferred():
            _ctrl_c()
            steps.append("first")
            _ctrl_c()
            steps.append("second")
        return 0

    monkeypatch.setattr(cli, "_run", hung_import)
    assert cli.main([]) == cli.EXIT_INTERRUPTED
    assert steps == ["first"]


def test_without_main_nothing_is_deferred() -> None:
    with cli._interrupts_deferred():
        pass  # a no-op context: build_parser() called by tests or an embedding app
    assert cli._EARLY_INTERRUPT is None
