"""Large buffers on transparent huge pages: the ``inferpool serve`` process restarts itself
once, at launch, with glibc's ``glibc.malloc.hugetlb=1`` tunable.

Why: every large body (a 64 MiB tensor, its answer) lands in a fresh ``malloc`` block,
which glibc maps anew for each request; on hosts whose transparent huge pages are
``madvise`` (Debian's and Ubuntu's default) the kernel then faults it in 4 KiB page by
page. Measured on the 2-core test VM, a copy into such a block ran at about 0.8 GB/s
against 18 GB/s for memcpy into memory already mapped, and most of a 64 MiB round trip
went there. With the tunable, glibc advises huge pages on the blocks it maps, 512 times
fewer faults (benchmarks/RESULTS.md, "huge pages").

glibc reads its tunables once, when the process starts, so the only way to give them to the
server's own process is to exec it again, with the same arguments, before anything else
runs; the workers and templates it starts inherit the environment. The restart happens
only where it changes something: glibc 2.35 or later (the first with the tunable), and
huge pages set to ``madvise`` (with ``always`` the blocks get them already; with
``never`` they cannot). A ``glibc.malloc.hugetlb`` the user set already, to any value
(``GLIBC_TUNABLES=glibc.malloc.hugetlb=0`` turns this off), is left as it is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TUNABLES = "GLIBC_TUNABLES"
HUGETLB = "glibc.malloc.hugetlb"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def glibc_version() -> tuple[int, int] | None:
    """glibc's (major, minor), or None under another C library (or none known)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    name, _, version = text.partition(" ")
    if name != "glibc":
        return None
    try:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def huge_pages_advised(mode_file: Path = THP_MODE) -> bool:
    """True when the kernel gives transparent huge pages only where they are advised."""
    try:
        return "[madvise]" in mode_file.read_text()
    except OSError:
        return False


def tunables_with_huge_pages(environ: dict[str, str] | os._Environ[str]) -> str | None:
    """``GLIBC_TUNABLES`` with ``glibc.malloc.hugetlb=1`` added; None when it names that
    tunable already (whatever its value: the user's choice, or our own restart)."""
    current = environ.get(TUNABLES, "")
    names = [item.partition("=")[0] for item in current.split(":") if item]
    if HUGETLB in names:
        return None
    return f"{current}:{HUGETLB}=1" if current else f"{HUGETLB}=1"


def restart_command() -> list[str]:
    """This process's command line, to exec again: the interpreter with its own flags,
    then the script or ``-m module`` and the arguments (``sys.orig_argv``)."""
    return [sys.executable, *sys.orig_argv[1:]]


def restart_with_huge_pages() -> None:
    """Exec this process again with the tunable when it would change something (see the
    module's text); return otherwise. Call it first thing, from the command's entry."""
    if sys.platform != "linux" or (glibc_version() or (0, 0)) < (2, 35):
        return
    tunables = tunables_with_huge_pages(os.environ)
    if tunables is None or not huge_pages_advised():
        return
    before = os.environ.get(TUNABLES)
    os.environ[TUNABLES] = tunables
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, restart_command())
    except OSError:
        # Cannot exec (a frozen or vanished interpreter): serve without the tunable, and
        # do not hand children what this process did not get either.
        if before is None:
            del os.environ[TUNABLES]
        else:
            os.environ[TUNABLES] = before
