"""MLServer itself (``mlserver start``) serving a repository beside inferpool, for the tests
that compare their answers: from the test's own interpreter (tox's mlserver environment
holds MLServer 1.7.1) or from a virtualenv's (tests/support/venvs.py: MLServer with its
alibi runtimes, which inferpool's environment cannot hold)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx

from tests.support import free_port


@contextmanager
def running_mlserver(
    repository: Path,
    python: str | Path = sys.executable,
    http_port: int | None = None,
    timeout: float = 300,
    settle: float = 0.0,
) -> Iterator[tuple[str, str]]:
    """MLServer serving ``repository`` in-process (no parallel workers), started by
    ``python``: its REST URL and gRPC address. ``http_port``: its REST port, when the
    repository's settings must name it before it starts (an explainer's infer_uri).
    ``settle``: seconds it must stay up and ready after it first was (RuntimeError,
    "mlserver exited", with its log if it exits or stops answering meanwhile)."""
    http_port = http_port or free_port()
    grpc_port = free_port()
    env = {
        **os.environ,
        "MLSERVER_HTTP_PORT": str(http_port),
        "MLSERVER_GRPC_PORT": str(grpc_port),
        "MLSERVER_METRICS_PORT": str(free_port()),
        "MLSERVER_PARALLEL_WORKERS": "0",
        "MLSERVER_HOST": "127.0.0.1",
    }
    command = [str(python), "-m", "mlserver.cli.main", "start", str(repository)]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = _wait_ready(f"http://127.0.0.1:{http_port}", process, log, timeout)
            if settle > 0:
                time.sleep(settle)
                try:
                    _wait_ready(url, process, log, 30)
                except TimeoutError as exc:  # alive, but its listener gone
                    raise RuntimeError(f"mlserver exited its REST listener: {exc}") from None
            yield url, f"127.0.0.1:{grpc_port}"
        finally:
            process.terminate()
            process.wait(30)


def _wait_ready(url: str, process: subprocess.Popen, log: IO[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout  # generous: a loaded machine
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"mlserver exited:\n{log.read().decode(errors='replace')}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    log.seek(0)
    tail = log.read().decode(errors="replace")[-4000:]
    raise TimeoutError(f"MLServer not ready after {timeout:.0f} s:\n{tail}")
