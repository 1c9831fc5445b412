"""Shared fixtures: a trained iris repository and a running server on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Server, build_iris_repository


@pytest.fixture(scope="session")
def iris_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_iris_repository(tmp_path_factory.mktemp("iris-repo"))


@pytest.fixture(scope="session")
def iris_server(iris_repo: Path) -> Iterator[Server]:
    """One in-process (``--workers 0``) server for read-only tests of the whole session."""
    with Server(iris_repo, "--workers", "0") as server:
        server.wait_ready()
        yield server
