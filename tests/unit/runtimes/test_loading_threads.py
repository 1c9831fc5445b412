"""Loading a boosted-trees model starts no OpenMP threads, so the process may still fork."""

import subprocess
import sys
import warnings

import pytest

from tests.support.runtimes import lightgbm_estimator, save_booster, xgboost_estimator

# Runs in a fresh interpreter: counts the process's threads around load_model.
CHILD = """
import sys
from inferpool.engine.worker.model import load_model
from inferpool.engine.worker.preload import thread_count
from inferpool.runtimes import {module}
from inferpool.settings import read_model_settings
from pathlib import Path

before = thread_count()
load_model(read_model_settings(Path(sys.argv[1]), "m"))
print(before, thread_count())
"""


@pytest.mark.parametrize("library", ["lightgbm", "xgboost"])
def test_loading_starts_no_threads(tmp_path, library):
    if library == "lightgbm":
        save_booster(tmp_path, lightgbm_estimator("classifier")[0].booster_, "model.txt")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            booster = xgboost_estimator("classifier")[0].get_booster()
            save_booster(tmp_path, booster, "model.json")
    child = subprocess.run(
        [sys.executable, "-c", CHILD.format(module=library), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"OMP_NUM_THREADS": "2", "PATH": ""},
    )
    assert child.returncode == 0, child.stderr
    before, after = map(int, child.stdout.split())
    assert after == before
