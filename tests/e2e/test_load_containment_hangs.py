"""Loading is contained (issue 37.1), the loads that hang: a model whose load never returns
is killed after ``--model-load-timeout`` and fails alone, once, as hung; the others serve.

Slow (each waits out a load timeout): in the ``slow`` tox environment. A library that never
returns from reading a file (here LightGBM opening a FIFO nobody writes; XGBoost 2 was seen
spinning for over 20 s on a UBJSON file cut after 100 bytes, but not every time): with
``--workers 0`` the load probe's child is killed, with workers the template is, and
restarted once without that model. A custom runtime marked ``fork_safe`` is loaded by the
template too: one whose ``load()`` sleeps forever is handled the same way.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_load_containment import infer_iris, settled
from tests.support import Server, build_iris_repository, write_custom_model
from tests.support.pool import children, process_exists, wait_for

pytestmark = pytest.mark.timeout(400)

TIMEOUT = 8  # --model-load-timeout, seconds

SLEEPER = """
import time

from inferpool import Runtime


class Sleeper(Runtime):
    fork_safe = True  # loaded by the worker template process

    def load(self):
        while True:
            time.sleep(1)

    def predict(self, payload, outputs):
        return payload
"""


def never_written(folder: Path) -> None:
    """A LightGBM model whose ``model.txt`` is a FIFO nobody writes: LightGBM's loader
    blocks opening it, for ever (deterministic, unlike a library's spin on a broken file)."""
    folder.mkdir(parents=True)
    os.mkfifo(folder / "model.txt")
    settings = {"name": folder.name, "runtime": "lightgbm", "parameters": {"uri": "./model.txt"}}
    (folder / "model-settings.json").write_text(json.dumps(settings))


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_library_that_hangs_on_a_file_fails_that_model_as_hung(
    tmp_path: Path, workers: str
) -> None:
    repository = build_iris_repository(tmp_path / "models")
    never_written(repository / "lgb-hangs")
    arguments = ("--workers", workers, "--no-exit-on-error", "--model-load-timeout", str(TIMEOUT))
    with Server(repository, *arguments) as server:
        server.wait_live(120)
        index = settled(server, 3, timeout=240)
        assert index["lgb-hangs"]["state"] == "FAILED"
        assert index["lgb-hangs"]["reason"] == (
            f"model.txt is not a valid LightGBM model (the process hung for {TIMEOUT} s and was "
            "killed while LightGBM parsed it; the file may be truncated or corrupt)"
        )
        assert index["iris-logreg"]["state"] == "READY"
        assert infer_iris(server).status_code == 200
        assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 503
        time.sleep(2)
        output = server.output()
        expected_restarts = 1 if workers == "2" else 0
        assert len(re.findall("worker template process restarted", output)) == expected_restarts
        probes = [c for _, c in children(server.process.pid).values() if b".probe" in c]
        assert not probes  # the hung probe was killed and reaped


def test_a_custom_load_that_hangs_in_the_template_fails_that_model_alone(tmp_path: Path) -> None:
    repository = build_iris_repository(tmp_path / "models")
    write_custom_model(repository / "sleeper", SLEEPER, "Sleeper")
    arguments = ("--workers", "2", "--no-exit-on-error", "--model-load-timeout", str(TIMEOUT))
    with Server(repository, *arguments) as server:
        server.wait_live(120)
        index = settled(server, 3, timeout=240)
        assert index["sleeper"]["reason"] == (
            f"the process loading it hung for {TIMEOUT} s and was killed while its runtime's "
            "load() ran (no model file opened yet)"
        )
        assert index["iris-rf"]["state"] == "READY"
        assert infer_iris(server, "iris-rf").status_code == 200
        output = server.output()
        assert "was killed: a load hung for 8 s while loading model 'sleeper'" in output
        assert len(re.findall("worker template process restarted", output)) == 1
        pids = set(children(server.process.pid))
    wait_for(lambda: not any(process_exists(pid) for pid in pids), 10, "children gone")
