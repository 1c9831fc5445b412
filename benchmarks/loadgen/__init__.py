"""Load generators: wrk (REST), h2load (gRPC), a built-in asyncio fallback, and Triton's
perf_analyzer (both transports, on request: ``--generator perf_analyzer``).

Every generator runs as a child process so its CPU time is measured the same way
(``wait4`` rusage) and reported next to the server's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

from benchmarks.loadgen.base import Job, LoadResult, Target

Generator = Callable[[Job], LoadResult]

INSTALL_HINT = "apt-get install wrk nghttp2-client"


def external_tool(transport: str) -> str:
    """The external generator for a transport: wrk speaks HTTP/1.1, h2load HTTP/2 (gRPC)."""
    return "h2load" if transport == "grpc" else "wrk"


def missing_tools() -> list[str]:
    """External generators that are not installed (the harness falls back to built-in)."""
    return [tool for tool in ("wrk", "h2load") if shutil.which(tool) is None]


def pick(transport: str, mode: str) -> tuple[str, Generator]:
    """The generator for ``transport`` under ``mode`` (auto | external | builtin |
    perf_analyzer)."""
    from benchmarks.loadgen import builtin, h2load, perf_analyzer, wrk

    if mode == "perf_analyzer":
        if perf_analyzer.find_binary() is None:
            raise RuntimeError(f"perf_analyzer is not installed: {perf_analyzer.INSTALL_HINT}")
        return "perf_analyzer", perf_analyzer.run
    tool = external_tool(transport)
    if mode == "builtin" or (mode == "auto" and shutil.which(tool) is None):
        return "builtin", builtin.run
    if shutil.which(tool) is None:
        raise RuntimeError(f"{tool} is not installed ({INSTALL_HINT})")
    return tool, (h2load.run if tool == "h2load" else wrk.run)


__all__ = ["Generator", "Job", "LoadResult", "Target", "missing_tools", "pick"]
