"""Tests of per-model environments: tox's ``environments`` environment makes them before the
tests and names them in variables (``named_by``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def named_by(variable: str, what: str) -> Path:
    """The path tox's environments environment names in ``variable`` (``what`` it made)."""
    named = os.environ.get(variable)
    if not named:
        pytest.fail(f"{variable} names no {what}: run tox -e environments")
    return Path(named)
