"""Test helpers: free ports (``benchmarks.ports``, shared with the harness), generated model
repositories, and real server processes.

The modules of this package hold the rest: ``runtimes`` (trained models, artefacts, the
echo runtime's model folders), ``pool`` (worker-pool tests), ``grpc`` (gRPC setups and
stubs), ``h2frames`` and ``h2client`` (hand-made HTTP/2 for the gRPC wire tests).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import httpx

from benchmarks.ports import free_port


def iris_data():
    from sklearn.datasets import load_iris

    return load_iris(return_X_y=True)


def write_sklearn_model(folder: Path, estimator, filename: str = "model.joblib") -> Path:
    import joblib

    folder.mkdir(parents=True, exist_ok=True)
    joblib.dump(estimator, folder / filename)
    return folder


def build_iris_repository(root: Path) -> Path:
    """``iris-logreg`` (LogisticRegression) and ``iris-rf`` (RandomForest, 20 trees)."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    X, y = iris_data()
    write_sklearn_model(root / "iris-logreg", LogisticRegression(max_iter=1000).fit(X, y))
    rf = RandomForestClassifier(n_estimators=20, random_state=0, n_jobs=1).fit(X, y)
    write_sklearn_model(root / "iris-rf", rf)
    return root


def wait_for_200(
    url: str,
    process: subprocess.Popen,
    output: Callable[[], str],
    timeout: float,
    interval: float = 0.1,
) -> httpx.Response:
    """Poll ``url`` (as a probe does) until it answers 200 and return that answer; fail
    with ``output()`` if ``process`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited {process.returncode}:\n{output()}")
        try:
            response = httpx.get(url, timeout=2)
            if response.status_code == 200:
                return response
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"{url} not 200 after {timeout}s:\n{output()}")


class Server:
    """``python -m inferpool serve`` as a subprocess on free ports, stopped with SIGTERM."""

    # Those not stopped yet: a failing test's report shows the end of their logs
    # (``tests/conftest.py``), which is all CI keeps of a server.
    running: ClassVar[set[Server]] = set()

    def __init__(
        self,
        repository: Path | None,
        *args: str,
        env: dict | None = None,
        new_session: bool = False,
    ) -> None:
        """``new_session``: its own process group, so that a test can signal the group."""
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.grpc_address = f"127.0.0.1:{self.grpc_port}"
        command = [sys.executable, "-m", "inferpool", "serve"]
        if repository is not None:
            command.append(str(repository))
        command += [
            "--host", "127.0.0.1",
            "--http-port", str(self.http_port),
            "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port),
            *args,
        ]  # fmt: skip
        self.log = tempfile.NamedTemporaryFile(prefix="inferpool-server-", suffix=".log")  # noqa: SIM115 - closed in __exit__
        self.process = subprocess.Popen(
            command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=new_session,
        )
        self.returncode: int | None = None
        Server.running.add(self)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def expect_lines(self, patterns: list[str], timeout: float = 10) -> str:
        """Wait until every regular expression of ``patterns`` matches in the output (log
        lines are written after the response), failing with the one that does not once
        ``timeout`` runs out; the output."""
        deadline = time.monotonic() + timeout
        while True:
            output = self.output()
            if all(re.search(p, output) for p in patterns) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for pattern in patterns:
            assert re.search(pattern, output), f"{pattern!r} not in the log:\n{output[-3000:]}"
        return output

    def wait_live(self, timeout: float = 60) -> None:
        self._wait("/v2/health/live", timeout)

    def wait_ready(self, timeout: float = 60) -> None:
        self._wait("/v2/health/ready", timeout)

    def _wait(self, path: str, timeout: float) -> None:
        wait_for_200(self.url + path, self.process, self.output, timeout, interval=0.05)

    def wait_exit(self, timeout: float = 60) -> int:
        self.returncode = self.process.wait(timeout)
        return self.returncode

    def stop(self, timeout: float = 60) -> int:
        Server.running.discard(self)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.wait_exit(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        self.log.close()


def write_custom_model(
    folder: Path, source: str, class_name: str, module: str | None = None, **settings
) -> Path:
    """A model folder served by a custom Runtime subclass written from ``source``."""
    import json
    import textwrap

    module = module or f"{folder.name.replace('-', '_')}_runtime"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    document = {"name": folder.name, "implementation": f"{module}.{class_name}", **settings}
    (folder / "model-settings.json").write_text(json.dumps(document))
    return folder


def rest_output(url: str, model: str, rows, output: str = "predict_proba"):
    """One output of a model for FP64 ``rows`` over REST, as a numpy array of its shape."""
    import numpy as np

    tensor = {"name": "x", "datatype": "FP64", "shape": list(rows.shape)}
    body = {"inputs": [{**tensor, "data": rows.ravel().tolist()}], "outputs": [{"name": output}]}
    reply = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    (answer,) = reply.json()["outputs"]
    return np.array(answer["data"]).reshape(answer["shape"])
