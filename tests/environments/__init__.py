"""Tests of per-model environments: tox's ``environments`` environment makes them before the
tests and names them in variables (``named_by``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import Server


def named_by(variable: str, what: str) -> Path:
    """The path tox's environments environment names in ``variable`` (``what`` it made)."""
    named = os.environ.get(variable)
    if not named:
        pytest.fail(f"{variable} names no {what}: run tox -e environments")
    return Path(named)


def wait_settled(server: Server, timeout: float = 180) -> dict[str, dict]:
    """The repository index once no model is loading (each READY or FAILED)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        index = {e["name"]: e for e in httpx.post(f"{server.url}/v2/repository/index").json()}
        if index and all(e["state"] not in ("LOADING", "UNAVAILABLE") for e in index.values()):
            return index
        time.sleep(0.2)
    raise TimeoutError(f"models still loading: {index}")


def serving_settled(
    root: Path, environments: Path, timeout: float = 180, workers: int = 2
) -> Iterator[Server]:
    """A server of ``root``'s models (two workers, or ``workers``, and two per environment,
    ``environments`` its environments' cache, failed models kept out), once settled."""
    arguments = ("--workers", str(workers), "--environment-workers", "2",
                 "--environments-dir", str(environments), "--no-exit-on-error")  # fmt: skip
    with Server(root, *arguments) as running:
        running.wait_live(timeout=120)
        wait_settled(running, timeout)
        yield running
