"""A measured server's process tree: its processes, resident memory and CPU seconds,
and a sampler of its peak RSS while a measurement runs."""

from __future__ import annotations

import threading

import psutil


def process_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (shared pages count per process)."""
    total = 0
    for proc in process_tree(pid):
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def tree_cpu(pid: int) -> dict[int, float]:
    """User+system CPU seconds per live process of the tree, keyed by pid."""
    usage = {}
    for proc in process_tree(pid):
        try:
            times = proc.cpu_times()
            usage[proc.pid] = times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return usage


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU spent between two :func:`tree_cpu` snapshots (processes born since count whole)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


class PeakRss:
    """Samples a tree's RSS on a thread while a measurement runs; ``peak`` is the maximum."""

    def __init__(self, pid: int | None, interval: float = 0.2) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set() and self.pid is not None:
            self.peak = max(self.peak, tree_rss(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
