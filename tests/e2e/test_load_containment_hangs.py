"""Loading is contained (issue 37.1), the loads that hang: a model whose load never returns
is killed after ``--model-load-timeout`` and fails alone, once, as hung; the others serve.

Slow (each waits out a load timeout): in the ``slow`` tox environment. XGBoost 2's loader
spins forever on a UBJSON file cut after 100 bytes (measured: still running after 25 s);
with ``--workers 0`` the load probe's child is killed, with workers the template is, and
restarted once without that model. A custom runtime marked ``fork_safe`` is loaded by the
template too: one whose ``load()`` sleeps forever is handled the same way.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_load_containment import infer_iris, settled
from tests.support import Server, build_iris_repository, write_custom_model
from tests.support.broken_models import file_model
from tests.support.pool import children, process_exists, wait_for
from tests.support.runtimes import xgboost_estimator

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


def hung_ubj() -> bytes:
    model, _ = xgboost_estimator("regressor")
    return bytes(model.get_booster().save_raw("ubj"))[:100]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_library_that_hangs_on_a_file_fails_that_model_as_hung(
    tmp_path: Path, workers: str
) -> None:
    repository = build_iris_repository(tmp_path / "models")
    file_model("model.ubj", hung_ubj())(repository / "xgb-hangs")
    arguments = ("--workers", workers, "--no-exit-on-error", "--model-load-timeout", str(TIMEOUT))
    with Server(repository, *arguments) as server:
        server.wait_live(120)
        index = settled(server, 3, timeout=240)
        assert index["xgb-hangs"]["state"] == "FAILED"
        assert index["xgb-hangs"]["reason"] == (
            f"model.ubj is not a valid XGBoost model (the process hung for {TIMEOUT} s and was "
            "killed while XGBoost parsed it; the file may be truncated or corrupt)"
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
