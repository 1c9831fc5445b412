"""A server-wide environment (MLServer's ``MLSERVER_ENV_TARBALL``), end to end with a
tarball that ``inferpool env pack`` builds here (offline: a hand-built wheel on
``--find-links``). About a minute (a virtualenv built, three worker groups): ``slow``.

Every model runs in it, as if each named it: a custom runtime reports the environment's
prefix and the package only the tarball holds, a scikit-learn model answers as its
estimator does (the server's libraries fill in what the environment lacks), over REST and
gRPC, and a model naming an environment of its own keeps it. With ``--workers 0`` the
start is refused in one sentence: environments need worker processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from inferpool.engine.environments.unpack import tarball_key
from tests.support import Server, iris_data, write_custom_model, write_sklearn_model
from tests.support.environments import build_wheel
from tests.support.grpc import infer_request, stub_for
from tests.support.where import make_venv

pytestmark = pytest.mark.timeout(300)

# Reports the interpreter's prefix and the version of envtest_alpha it finds (if any).
REPORTER = """
import importlib.metadata
import json
import os
import sys

import numpy as np

from inferpool import Runtime


class Reporter(Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        try:
            alpha = importlib.metadata.version("envtest_alpha")
        except importlib.metadata.PackageNotFoundError:
            alpha = ""
        report = {"prefix": sys.prefix, "alpha": alpha, "pid": os.getpid()}
        return {outputs[0]: np.array([json.dumps(report).encode()], dtype=object)}
"""
IO = {
    "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 2]}],
    "outputs": [{"name": "where", "datatype": "BYTES", "shape": [-1]}],
}
X, Y = iris_data()


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An environment holding envtest_alpha 1.4.2, packed by ``inferpool env pack``."""
    folder = tmp_path_factory.mktemp("pack")
    build_wheel(folder / "wheels", "envtest_alpha", "1.4.2")
    (folder / "requirements.txt").write_text("envtest_alpha==1.4.2\n")
    out = folder / "environment.tar.gz"
    command = [
        sys.executable, "-m", "inferpool", "env", "pack", str(folder / "requirements.txt"),
        "-o", str(out), "--no-index", "--find-links", str(folder / "wheels"),
    ]  # fmt: skip
    packed = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert packed.returncode == 0, packed.stderr
    return out


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_custom_model(root / "reporter", REPORTER, "Reporter", **IO)
    own = make_venv(tmp_path_factory.mktemp("own") / "venv")
    parameters = {"environment_path": str(own)}
    write_custom_model(root / "own", REPORTER, "Reporter", parameters=parameters, **IO)
    write_sklearn_model(root / "iris", LogisticRegression(max_iter=500).fit(X, Y))
    return root


@pytest.fixture(scope="module")
def server(tarball: Path, repository: Path, tmp_path_factory) -> Iterator[Server]:
    """Named by MLServer's variable (``environment_tarball`` in settings.json and
    INFERPOOL_ENVIRONMENT_TARBALL set the same field: tests/compat/test_settings_env.py)."""
    cache = tmp_path_factory.mktemp("cache")
    env = {"MLSERVER_ENV_TARBALL": str(tarball)}
    flags = ("--workers", "2", "--environments-dir", str(cache))
    with Server(repository, *flags, env=env) as running:
        running.wait_ready(180)
        running.cache = cache
        running.repository = repository
        yield running


def report(server: Server, model: str) -> dict:
    body = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 2], "data": [1, 2]}]}
    answer = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return json.loads(answer.json()["outputs"][0]["data"][0])


def environment_slots(server: Server, tarball: Path) -> set[int]:
    """The worker slots of the group started for the tarball (as many as --workers)."""
    pattern = rf"starting worker group 'env-{tarball_key(tarball)[:8]}' \(workers \[(\d+), (\d+)\]"
    return {int(slot) for slot in re.search(pattern, server.expect_lines([pattern])).groups()}


def test_every_model_runs_in_the_servers_environment(server: Server, tarball: Path) -> None:
    unpacked = server.cache / tarball_key(tarball)
    where = report(server, "reporter")
    assert Path(where["prefix"]) == unpacked  # the tarball's interpreter, unpacked once
    assert where["alpha"] == "1.4.2"  # only the tarball holds it
    with stub_for(server) as stub:
        answer = stub.ModelInfer(infer_request("reporter", x=np.array([[1.0, 2.0]])))
    assert json.loads(answer.outputs[0].contents.bytes_contents[0])["prefix"] == where["prefix"]
    # Its replicas are on the environment's workers, none on the server's own (0 and 1).
    assert placed_on(server, "reporter") == environment_slots(server, tarball)


def test_a_built_in_runtime_runs_there_with_the_servers_libraries(
    server: Server, tarball: Path
) -> None:
    import joblib

    estimator = joblib.load(server.repository / "iris" / "model.joblib")
    tensor = {"name": "x", "datatype": "FP64", "shape": [3, 4], "data": X[:3].ravel().tolist()}
    answer = httpx.post(f"{server.url}/v2/models/iris/infer", json={"inputs": [tensor]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == estimator.predict(X[:3]).tolist()
    assert placed_on(server, "iris") == environment_slots(server, tarball)


def test_a_model_naming_its_own_environment_keeps_it(server: Server, tarball: Path) -> None:
    where = report(server, "own")
    assert Path(where["prefix"]).name == "venv" and where["alpha"] == ""
    assert not placed_on(server, "own") & environment_slots(server, tarball)


def placed_on(server: Server, model: str) -> set[int]:
    """The worker slots holding the model's replicas, as its placement's log line says."""
    pattern = rf"model '{model}': \d+ replica\(s\) on workers \[([\d, ]+)\]"
    found = re.search(pattern, server.expect_lines([pattern]))
    return {int(slot) for slot in found.group(1).split(",")}


def test_without_workers_the_start_is_refused(tarball: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "inferpool", "serve", str(tmp_path), "--workers", "0"]
    env = {**os.environ, "MLSERVER_ENV_TARBALL": str(tarball)}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert "environment_tarball" in result.stderr and "--workers 1 or more" in result.stderr
    assert "Traceback" not in result.stderr
