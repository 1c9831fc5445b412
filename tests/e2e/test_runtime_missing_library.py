"""A runtime whose library is not installed: the model is FAILED with the pip extra to
install, not an ImportError traceback, and the server stays up (``--no-exit-on-error``).
With workers, no worker offers the runtime (DESIGN §3's capability filter): the reason is
the scheduler's one summary sentence, with the extra."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support import Server
from tests.support.runtimes import (
    lightgbm_estimator,
    save_booster,
    save_pickle,
    xgboost_estimator,
)

# Loaded by the server's Python at start-up (PYTHONPATH): imports of the packages named in
# HIDE_PACKAGES fail as if they were not installed.
SITECUSTOMIZE = """
import importlib.abc
import os
import sys

HIDDEN = set(os.environ.get("HIDE_PACKAGES", "").split(","))


class HidePackages(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, HidePackages())
"""


@pytest.fixture(scope="module", params=["0", "2"], ids=["w0", "w2"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("missing")
    repository = root / "models"
    lgb, _ = lightgbm_estimator("classifier")
    save_booster(repository / "lgb-txt", lgb.booster_, "model.txt")
    save_pickle(repository / "lgb-pickled", lgb)
    xgb, _ = xgboost_estimator("regressor")
    save_booster(repository / "xgb-json", xgb.get_booster(), "model.json")
    (repository / "mlflow-model").mkdir()
    (repository / "mlflow-model" / "MLmodel").write_text("flavors: {}\n")
    shim = root / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {"PYTHONPATH": str(shim), "HIDE_PACKAGES": "lightgbm,xgboost,mlflow"}
    arguments = ("--workers", request.param, "--no-exit-on-error")
    with Server(repository, *arguments, env=env) as server:
        server.wait_live()
        yield server


def settled_status(server: Server, model: str, timeout: float = 60) -> dict:
    """The model's metadata document once it has stopped loading."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        document = httpx.get(f"{server.url}/v2/models/{model}", timeout=5).json()
        if document.get("state") not in (None, "LOADING", "UNAVAILABLE"):  # None: not listed yet
            return document
        time.sleep(0.1)
    raise TimeoutError(f"model {model} still loading after {timeout}s")


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        ("lgb-txt", "lightgbm"),
        ("lgb-pickled", "lightgbm"),
        ("xgb-json", "xgboost"),
        ("mlflow-model", "mlflow"),
    ],
)
def test_missing_library_fails_the_model_with_the_extra_to_install(server, model, extra):
    document = settled_status(server, model)
    assert document["state"] == "FAILED"
    assert f"install inferpool[{extra}]" in document["reason"]
    assert "Traceback" not in document["reason"]


def test_a_runtime_no_worker_offers_fails_with_one_summary_sentence(server):
    document = settled_status(server, "xgb-json")
    workers = 2 if "--workers 2" in " ".join(map(str, server.process.args)) else 1
    counted = "2 workers; 2 lack" if workers == 2 else "1 worker; 1 lacks"
    assert document["reason"] == (
        f"cannot place 1 replica of 'xgb-json': {counted} 'xgboost' (install inferpool[xgboost])"
    )


def test_server_is_live_but_not_ready(server):
    settled_status(server, "lgb-txt")
    assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
    ready = httpx.get(f"{server.url}/v2/health/ready")
    assert ready.status_code == 503


def test_infer_on_the_failed_model_is_503(server):
    settled_status(server, "xgb-json")
    body = {"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP64", "data": [0.0] * 8}]}
    response = httpx.post(f"{server.url}/v2/models/xgb-json/infer", json=body)
    assert response.status_code == 503
    assert "install inferpool[xgboost]" in response.json()["error"]
