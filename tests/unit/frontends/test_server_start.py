"""The serve loop's start-up: a failure to start is one log line and exit code 1, never a
traceback (an overloaded host where the workers' template process does not come up)."""

from __future__ import annotations

import asyncio
import logging
import signal

import pytest

from inferpool.errors import NotReady
from inferpool.frontends import server


class _Client:
    """An engine client whose start fails as the template keeper's does on a stalled host."""

    async def start(self) -> list[object]:
        raise NotReady("the worker template process did not come up within 180s")


def test_workers_that_never_come_up_end_the_start_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> int:
        signals = server._Signals()
        try:
            return await server._start_then_wait(_Client(), signals)  # type: ignore[arg-type]
        finally:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    with caplog.at_level(logging.CRITICAL, logger="inferpool"):
        assert asyncio.run(scenario()) == 1
    [record] = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert record.getMessage() == (
        "the server could not start: the worker template process did not come up within 180s"
    )
    assert record.exc_info is None
