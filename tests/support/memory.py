"""Helpers for the memory tests: a model that allocates what it is asked, a model that leaks,
workers' private memory, and the recycle counter on /metrics."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import psutil

from tests.support import write_custom_model
from tests.support.pool import template_pid

MIB = 1 << 20

# Keeps ``load_mb`` MiB from its load on (a parameter). Row [MiB, how]: allocates MiB
# and touches it, at once (how 0: one numpy array) or one MiB at a time (how 1: the worker
# grows up to the limit first), then answers the sum.
HOG_RUNTIME = """
import numpy as np

from inferpool import Runtime

MIB = 1 << 20


class Hog(Runtime):
    def load(self):
        self.kept = np.ones(self.settings.parameters.extra.get("load_mb", 0) * MIB // 8)

    def predict(self, payload, outputs):
        mib, how = int(payload[0, 0]), int(payload[0, 1])
        if how == 0:
            held = np.ones(mib * MIB // 8)
            total = float(held[:: 4096 // 8].sum())
        else:
            held = [b"\\1" * MIB for _ in range(mib)]
            total = float(len(held))
        del held
        return {outputs[0]: np.full(len(payload), total)}
"""

# Keeps a growing list: each call adds ``leak_mb`` MiB (touched) that is never freed.
LEAK_RUNTIME = """
import numpy as np

from inferpool import Runtime


class Leak(Runtime):
    def load(self):
        self.kept = []
        self.step = int(self.settings.parameters.extra.get("leak_mb", 1)) << 20

    def predict(self, payload, outputs):
        self.kept.append(np.ones(self.step // 8))
        return {outputs[0]: payload.sum(axis=1)}
"""

TWO_COLUMNS = {
    "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 2]}],
    "outputs": [{"name": "y", "datatype": "FP64", "shape": [-1]}],
}


def write_hog(root: Path, name: str, **settings: object) -> Path:
    return write_custom_model(root / name, HOG_RUNTIME, "Hog", **TWO_COLUMNS, **settings)


def write_leak(root: Path, name: str, leak_mb: int) -> Path:
    extra = {"parameters": {"extra": {"leak_mb": leak_mb}}}
    return write_custom_model(root / name, LEAK_RUNTIME, "Leak", **TWO_COLUMNS, **extra)


def two_columns(a: float, b: float) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 2], "data": [a, b]}]}


def workers_private_mib(server_pid: int) -> dict[int, float]:
    """Each live worker's private memory (USS), in MiB, by pid."""
    found = {}
    for worker in psutil.Process(template_pid(server_pid)).children():
        try:
            found[worker.pid] = worker.memory_full_info().uss / MIB
        except psutil.NoSuchProcess:
            continue
    return found


def recycles(metrics_url: str) -> dict[str, float]:
    """``inferpool_worker_recycles_total`` by reason, from /metrics."""
    text = httpx.get(metrics_url, timeout=10).text
    pattern = r'^inferpool_worker_recycles_total\{reason="(\w+)"\} (\S+)$'
    return {reason: float(value) for reason, value in re.findall(pattern, text, re.M)}
