"""The PSS of an inferpool server's processes (frontend, template, workers), each named by
its role: what ``python -m benchmarks memory`` reads. PSS (proportional set size) splits a
page shared by several processes between them, so a total over processes counts a page
shared copy-on-write once, where summed RSS counts it in every process."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

MIB = 1 << 20
TEMPLATE_MODULE = "inferpool.engine.worker.template"


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    role: str  # frontend | template | worker | other
    pss: int
    rss: int


def roles(processes: list[tuple[int, int, list[str]]], root: int) -> dict[int, str]:
    """Name each process of a server from (pid, parent pid, command line): the root is the
    frontend, its child running the template module the template, and the other processes
    with that command line the workers (forked from a template, so they keep it; one whose
    template exited has been handed to another parent)."""
    named = {}
    for pid, parent, cmdline in processes:
        if pid == root:
            named[pid] = "frontend"
        elif TEMPLATE_MODULE not in cmdline:
            named[pid] = "other"
        else:
            named[pid] = "template" if parent == root else "worker"
    return named


def server_processes(root: int) -> list[psutil.Process]:
    """The root, its descendants, and the processes of its session (a server started here
    leads one): a worker outlives a template that exits, and is then no descendant."""
    try:
        top = psutil.Process(root)
        procs = {p.pid: p for p in [top, *top.children(recursive=True)]}
    except psutil.NoSuchProcess:
        return []
    for proc in psutil.process_iter():
        try:
            if proc.pid not in procs and os.getsid(proc.pid) == root:
                procs[proc.pid] = proc
        except (ProcessLookupError, PermissionError):
            continue
    return list(procs.values())


def tree_memory(root: int) -> list[ProcessMemory]:
    """PSS and RSS of every live process of the server whose frontend is ``root``."""
    found = []
    for proc in server_processes(root):
        try:
            found.append((proc, proc.ppid(), proc.cmdline(), proc.memory_full_info()))
        except psutil.NoSuchProcess:
            continue  # it exited between the listing and the reading
    named = roles([(p.pid, parent, cmd) for p, parent, cmd, _ in found], root)
    return [ProcessMemory(p.pid, named[p.pid], m.pss, m.rss) for p, _, _, m in found]


def total(processes: list[ProcessMemory]) -> int:
    return sum(p.pss for p in processes)


def breakdown(processes: list[ProcessMemory]) -> str:
    """``frontend / template / worker+worker...`` in MiB, e.g. ``55 / 69 / 44+44``."""

    def of(role: str) -> str:
        return "+".join(f"{p.pss / MIB:.0f}" for p in processes if p.role == role) or "-"

    text = f"{of('frontend')} / {of('template')} / {of('worker')}"
    return text + (f" (other {of('other')})" if any(p.role == "other" for p in processes) else "")


def settle(root: int, workers: int, timeout: float = 20.0) -> list[ProcessMemory]:
    """The tree's memory once it holds N workers (a retired generation has gone) and its
    total PSS moved by less than 2 MiB in a quarter second; the last reading at ``timeout``."""
    deadline = time.monotonic() + timeout
    previous = tree_memory(root)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        current = tree_memory(root)
        count = sum(p.role == "worker" for p in current)
        if count == workers and abs(total(current) - total(previous)) < 2 * MIB:
            return current
        previous = current
    return previous
