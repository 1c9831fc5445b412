"""``inferpool serve`` restarts itself once with ``glibc.malloc.hugetlb=1`` (large bodies on
huge pages, inferpool.huge_pages): the process launched is the one that serves, its
workers inherit the tunable, and a user's own value for it is kept."""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil

from inferpool.huge_pages import glibc_version, huge_pages_advised
from tests.support import Server

RESTARTS = huge_pages_advised() and (glibc_version() or (0, 0)) >= (2, 35)
IRIS = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                    "data": [5.1, 3.5, 1.4, 0.2]}]}  # fmt: skip


def tunables(pid: int) -> str | None:
    """The process's GLIBC_TUNABLES as it was exec'd (up to its first ':', which glibc
    overwrites as it reads it)."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"GLIBC_TUNABLES="):
            return item.partition(b"=")[2].decode()
    return None


def serve_and_read(repo: Path, env: dict[str, str]) -> tuple[str | None, list[str | None]]:
    """The server's tunables and its workers', once it has answered a prediction."""
    with Server(repo, "--workers", "2", env=env) as server:
        server.wait_ready()
        answer = httpx.post(f"{server.url}/v2/models/iris-logreg/infer", json=IRIS, timeout=30)
        assert answer.status_code == 200, answer.text
        pid = server.process.pid  # exec keeps the pid: the process launched serves
        assert psutil.Process(pid).cmdline()[1:4] == ["-m", "inferpool", "serve"]
        children = psutil.Process(pid).children(recursive=True)
        assert len(children) >= 2
        return tunables(pid), [tunables(child.pid) for child in children]


def test_the_server_and_its_workers_run_with_the_tunable(iris_repo, monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    server, workers = serve_and_read(iris_repo, {})
    expected = "glibc.malloc.hugetlb=1" if RESTARTS else None
    assert server == expected
    assert set(workers) == {expected}


def test_a_value_the_user_set_is_kept(iris_repo):
    """``glibc.malloc.hugetlb=0`` turns it off. (Other tunables get it added behind them,
    tests/unit/test_huge_pages.py: /proc shows a process's GLIBC_TUNABLES only up to its
    first ':' once glibc has read it, so it cannot be checked from here.)"""
    server, workers = serve_and_read(iris_repo, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert server == "glibc.malloc.hugetlb=0"
    assert set(workers) == {"glibc.malloc.hugetlb=0"}
