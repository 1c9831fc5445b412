"""What an inference answers for each state of a model, over REST and gRPC, with
--workers 0 and 2: a model that is LOADING is 503 / UNAVAILABLE with ``Retry-After``
(gRPC ``grpc-retry-pushback-ms``): it will serve soon; once unloaded it is 404 /
NOT_FOUND saying so, without it. A pipeline answers as its member does, naming it, and
serves again once its member is loaded. (An unloaded model's index entry, model-ready and
statistics: test_repository_index.py; a failed member: test_pipelines.py.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from tests.support import Server, write_custom_model
from tests.support.grpc import WORKER_COUNTS, infer_request, stub_for
from tests.support.pipelines import write_pipeline

pytestmark = pytest.mark.timeout(180)

# Sleeps at load for the seconds its folder's ``delay`` file says (none at start-up).
SLOW_SOURCE = """
import time
from pathlib import Path

import numpy as np

from inferpool import Runtime


class Slow(Runtime):
    def load(self):
        delay = Path(self.settings.folder, "delay")
        if delay.exists():
            time.sleep(float(delay.read_text()))

    def predict(self, payload, outputs):
        return {outputs[0]: np.asarray(payload, dtype=np.float64) * 2}
"""
SPEC = {"name": "x", "datatype": "FP64", "shape": [-1, 2]}
ROWS = np.array([[1.0, 2.0]])
LOAD_SECONDS = 5


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda w: f"w{w}")
def server(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("states")
    write_custom_model(
        root / "slow",
        SLOW_SOURCE,
        "Slow",
        inputs=[SPEC],
        outputs=[{"name": "doubled", "datatype": "FP64", "shape": [-1, 2]}],
    )
    write_pipeline(root, "twice", {"steps": [{"model": "slow"}]})
    flags = ("--workers", str(request.param), "--model-control-mode", "explicit")
    with Server(root, *flags) as running:
        running.wait_ready(120)
        running.root = root
        yield running


def rest_infer(server: Server, model: str) -> httpx.Response:
    body = {"inputs": [{**SPEC, "shape": [1, 2], "data": ROWS.ravel().tolist()}]}
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)


def grpc_refusal(server: Server, model: str) -> tuple[grpc.StatusCode, str, dict]:
    """The code, message and trailing metadata of a gRPC inference that must fail."""
    with stub_for(server) as stub, pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(infer_request(model, x=ROWS), timeout=30)
    error = caught.value
    return error.code(), error.details(), dict(error.trailing_metadata() or ())


def state_of(server: Server, model: str) -> str:
    index = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
    return next(entry["state"] for entry in index if entry["name"] == model)


def api(server: Server, action: str, model: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/repository/models/{model}/{action}", timeout=120)


def test_loading_is_503_with_retry_after_and_unloaded_is_404(server: Server) -> None:
    root: Path = server.root
    assert api(server, "unload", "slow").status_code == 200
    # Unloaded: 404 without Retry-After, for the model and for the pipeline calling it.
    unloaded = "model 'slow' was unloaded (load it again to serve it)"
    reply = rest_infer(server, "slow")
    assert (reply.status_code, reply.json()) == (404, {"error": unloaded})
    assert "retry-after" not in reply.headers
    assert grpc_refusal(server, "slow")[:2] == (grpc.StatusCode.NOT_FOUND, unloaded)
    # A custom endpoint's call too (its paths are unknown while it is not loaded).
    custom = httpx.post(f"{server.url}/v2/models/slow/anything", content=b"{}", timeout=30)
    assert (custom.status_code, custom.json()) == (404, {"error": unloaded})
    step = "pipeline 'twice', step 1 ('slow')"
    reply = rest_infer(server, "twice")
    assert (reply.status_code, reply.json()) == (404, {"error": f"{step}: {unloaded}"})
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200

    (root / "slow" / "delay").write_text(str(LOAD_SECONDS))
    loaded: list[httpx.Response] = []
    loading = threading.Thread(target=lambda: loaded.append(api(server, "load", "slow")))
    loading.start()
    try:
        deadline = time.monotonic() + LOAD_SECONDS
        while state_of(server, "slow") != "LOADING":
            assert time.monotonic() < deadline, "the model never showed LOADING"
            time.sleep(0.02)
        # Loading: 503 with Retry-After (gRPC: UNAVAILABLE with pushback), both models.
        reply = rest_infer(server, "slow")
        assert reply.status_code == 503, reply.text
        assert reply.json() == {"error": "model 'slow' is LOADING"}
        assert reply.headers["retry-after"] == "1"
        code, message, trailers = grpc_refusal(server, "slow")
        assert (code, message) == (grpc.StatusCode.UNAVAILABLE, "model 'slow' is LOADING")
        assert trailers["grpc-retry-pushback-ms"] == "1000"
        reply = rest_infer(server, "twice")
        assert reply.status_code == 503, reply.text
        assert reply.json() == {"error": f"{step}: model 'slow' is LOADING"}
        assert reply.headers["retry-after"] == "1"
        code, message, trailers = grpc_refusal(server, "twice")
        assert code is grpc.StatusCode.UNAVAILABLE and message.startswith(step)
        assert trailers["grpc-retry-pushback-ms"] == "1000"
    finally:
        loading.join(LOAD_SECONDS * 10)
        (root / "slow" / "delay").unlink()
    assert loaded[0].status_code == 200, loaded[0].text
    for model in ("slow", "twice"):
        reply = rest_infer(server, model)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == [2.0, 4.0]
        assert state_of(server, model) == "READY"
