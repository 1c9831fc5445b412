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
        os.kill(os.getpid(), signal.SIGINT)
        signal.sigtimedwait([], 0)  # nothing: the handler has run by the next bytecode
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
