"""inferpool.huge_pages: when ``inferpool serve`` restarts itself with glibc's
``glibc.malloc.hugetlb=1``, and that the tunable puts a large block on huge pages here."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inferpool import huge_pages
from inferpool.huge_pages import (
    glibc_version,
    huge_pages_advised,
    restart_command,
    tunables_with_huge_pages,
)


def test_the_tunable_is_added_to_what_the_user_set():
    assert tunables_with_huge_pages({}) == "glibc.malloc.hugetlb=1"
    assert tunables_with_huge_pages({"GLIBC_TUNABLES": ""}) == "glibc.malloc.hugetlb=1"
    mine = "glibc.malloc.tcache_count=7"
    assert tunables_with_huge_pages({"GLIBC_TUNABLES": mine}) == f"{mine}:glibc.malloc.hugetlb=1"


@pytest.mark.parametrize("value", ["0", "1", "2"])
def test_a_hugetlb_the_user_set_is_left_alone(value):
    """Any value, ours after the restart (so it happens once) or the user's opt-out."""
    tunables = f"glibc.malloc.tcache_count=7:glibc.malloc.hugetlb={value}"
    assert tunables_with_huge_pages({"GLIBC_TUNABLES": tunables}) is None


def test_only_the_madvise_mode_asks_for_the_restart(tmp_path):
    mode = tmp_path / "enabled"
    mode.write_text("always [madvise] never\n")
    assert huge_pages_advised(mode)
    mode.write_text("[always] madvise never\n")
    assert not huge_pages_advised(mode)
    mode.write_text("always madvise [never]\n")
    assert not huge_pages_advised(mode)
    assert not huge_pages_advised(tmp_path / "missing")


def test_the_restart_runs_the_same_command_line(monkeypatch):
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-X", "dev", "-m", "inferpool", "serve"])
    assert restart_command() == [sys.executable, "-X", "dev", "-m", "inferpool", "serve"]


def test_no_restart_where_it_would_change_nothing(monkeypatch):
    """Another C library, an old glibc, huge pages not ``madvise``, or the tunable set:
    the process goes on (exec would replace it)."""

    def no_exec(*args):
        raise AssertionError("exec called")

    monkeypatch.setattr(huge_pages.os, "execv", no_exec)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    for version in (None, (2, 34)):
        monkeypatch.setattr(huge_pages, "glibc_version", lambda v=version: v)
        huge_pages.restart_with_huge_pages()
    monkeypatch.setattr(huge_pages, "glibc_version", lambda: (2, 36))
    monkeypatch.setattr(huge_pages, "huge_pages_advised", lambda: False)
    huge_pages.restart_with_huge_pages()
    monkeypatch.setattr(huge_pages, "huge_pages_advised", lambda: True)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    huge_pages.restart_with_huge_pages()
    assert huge_pages.os.environ["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"


def test_a_failed_exec_leaves_the_environment_as_it_was(monkeypatch):
    def failing_exec(*args):
        raise OSError("no interpreter")

    monkeypatch.setattr(huge_pages.os, "execv", failing_exec)
    monkeypatch.setattr(huge_pages, "glibc_version", lambda: (2, 36))
    monkeypatch.setattr(huge_pages, "huge_pages_advised", lambda: True)
    monkeypatch.setattr(huge_pages.sys, "platform", "linux")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=7")
    huge_pages.restart_with_huge_pages()
    assert huge_pages.os.environ["GLIBC_TUNABLES"] == "glibc.malloc.tcache_count=7"
    monkeypatch.delenv("GLIBC_TUNABLES")
    huge_pages.restart_with_huge_pages()
    assert "GLIBC_TUNABLES" not in huge_pages.os.environ


HUGE_BLOCK = """
from pathlib import Path
block = bytearray(64 << 20)
block[:] = b"x" * len(block)  # a copy into a fresh block, as a large body is
rollup = Path("/proc/self/smaps_rollup").read_text().splitlines()
print(next(int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:")))
"""


def anon_huge_kib(tunables: str | None) -> int:
    env = {"PATH": "/usr/bin:/bin"}
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    run = subprocess.run(
        [sys.executable, "-c", HUGE_BLOCK], env=env, capture_output=True, text=True, check=True
    )
    return int(run.stdout)


@pytest.mark.skipif(
    not huge_pages_advised() or (glibc_version() or (0, 0)) < (2, 35),
    reason="needs glibc 2.35+ and transparent huge pages in madvise mode",
)
def test_the_tunable_puts_a_large_block_on_huge_pages():
    """Why the restart is worth it: with it a 64 MiB block is (mostly) on huge pages;
    without it, on none."""
    assert anon_huge_kib(None) == 0
    assert anon_huge_kib("glibc.malloc.hugetlb=0") == 0
    assert anon_huge_kib("glibc.malloc.hugetlb=1") >= 32 << 10
