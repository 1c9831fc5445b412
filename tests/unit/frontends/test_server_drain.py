"""The serve loop's decisions (``frontends/server.py``) with a stand-in engine client and
stand-in listeners: the exit code of each way a start-up ends (a missing repository, models
that fail, a signal before it is ready: 130 for Ctrl-C, 0 for SIGTERM), the signals counted
(a second one ends the drain delay), the drain's order, and Hypercorn's configuration."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from types import SimpleNamespace
from typing import Any

import pytest

from inferpool.engine.lifecycle import StartupFailed
from inferpool.frontends import server
from inferpool.settings import ServerSettings


class Client:
    """An engine client: its start does what ``outcome`` says (never ends if None)."""

    def __init__(self, outcome: Any = (), workers: int = 0, drain_delay: float = 0.0) -> None:
        self.outcome = outcome
        self.settings = SimpleNamespace(workers=workers, drain_delay=drain_delay)
        self.started = False
        self.cancelled = False
        self.steps: list[str] = []

    async def start(self) -> list[object]:
        if self.outcome is None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        self.started = True
        return list(self.outcome)

    def not_ready_reason(self) -> str | None:
        return None

    def begin_drain(self) -> None:
        self.steps.append("not ready")

    def begin_shutdown(self) -> None:
        self.steps.append("no longer accepting")

    async def close(self) -> None:
        self.steps.append("engine closed")


async def with_signals(work: Any) -> Any:
    """Run ``work(signals)`` with the loop's SIGTERM and SIGINT handlers, removed after."""
    signals = server._Signals()
    try:
        return await work(signals)
    finally:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


@pytest.mark.parametrize(
    ("outcome", "lines"),
    [
        (FileNotFoundError("no model repository at /nowhere"), ["no model repository at /nowhere"]),
        (
            StartupFailed(["model 'a' failed", "model 'b' failed"]),
            ["model 'a' failed", "model 'b' failed"],
        ),
    ],
)
def test_a_failed_start_is_exit_code_1_with_its_reasons(caplog, outcome, lines) -> None:
    async def work(signals: server._Signals) -> int:
        return await server._start_then_wait(Client(outcome), signals)  # type: ignore[arg-type]

    with caplog.at_level(logging.CRITICAL, logger="inferpool"):
        assert asyncio.run(with_signals(work)) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL] == lines


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_a_signal_before_the_start_ends_cancels_it(sig: signal.Signals, code: int) -> None:
    client = Client(outcome=None)

    async def work(signals: server._Signals) -> int:
        asyncio.get_running_loop().call_later(0.05, signals._received, sig)
        return await server._start_then_wait(client, signals)  # type: ignore[arg-type]

    assert asyncio.run(with_signals(work)) == code
    assert client.cancelled and signal.SIGINT + 128 == server.INTERRUPTED


def test_a_started_server_waits_for_a_signal_then_exits_0() -> None:
    client = Client(outcome=["a model"], workers=2)

    async def work(signals: server._Signals) -> int:
        asyncio.get_running_loop().call_later(0.05, signals._received, signal.SIGTERM)
        return await server._start_then_wait(client, signals)  # type: ignore[arg-type]

    try:
        assert asyncio.run(with_signals(work)) == 0
        assert gc.get_freeze_count() > 0  # with workers, the start-up heap is frozen
    finally:
        gc.unfreeze()
    assert client.started


def test_a_second_signal_ends_the_drain_delay(caplog) -> None:
    client = Client(drain_delay=60.0)
    client.started = True
    stopped: list[str] = []

    class Listener:
        async def stop(self) -> None:
            stopped.append("stopped")
            client.steps.append("listener stopped")

    async def work(signals: server._Signals) -> float:
        signals._received(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, signals._received, signal.SIGINT)
        loop.call_later(0.06, signals._received, signal.SIGINT)  # a third: nothing more
        began = time.monotonic()
        await server._drain(client, [Listener(), Listener()], signals)  # type: ignore[arg-type, list-item]
        return time.monotonic() - began

    with caplog.at_level(logging.INFO, logger="inferpool"):
        took = asyncio.run(with_signals(work))
    assert took < 30  # not the 60 s of drain_delay
    assert client.steps == [
        "not ready", "no longer accepting", "listener stopped", "listener stopped", "engine closed"
    ]  # fmt: skip
    text = caplog.text
    assert "SIGTERM: shutting down, not ready; accepting for 60s more (drain_delay)" in text
    assert text.count("again: the drain delay ends now") == 1


def test_a_server_never_ready_drains_without_delay() -> None:
    client = Client(drain_delay=60.0)  # never started: in no endpoint list

    async def work(signals: server._Signals) -> float:
        signals._received(signal.SIGTERM)
        began = time.monotonic()
        await server._drain(client, [], signals)  # type: ignore[arg-type]
        return time.monotonic() - began

    assert asyncio.run(with_signals(work)) < 30
    assert client.steps == ["not ready", "no longer accepting", "engine closed"]


@pytest.mark.parametrize("model_timeout", [0.0, 90.0])
def test_hypercorns_configuration_follows_the_limits(model_timeout: float) -> None:
    settings = ServerSettings(
        shutdown_timeout=7, idle_timeout=11, header_timeout=3, body_timeout=4,
        model_timeout=model_timeout, request_timeout=5, max_header_bytes=9000,
        max_concurrent_streams=33,
    )  # fmt: skip
    config = server._hypercorn_config(SimpleNamespace(), settings)
    assert config.graceful_timeout == 7 and config.keep_alive_timeout == 11
    # Long enough for the slowest model's silent wait; none when models may run forever.
    assert config.read_timeout == (None if model_timeout == 0 else 91)
    assert config.h11_max_incomplete_size == 9000 == config.h2_max_header_list_size
    assert config.h2_max_concurrent_streams == 33
