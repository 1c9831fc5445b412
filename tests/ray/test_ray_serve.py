"""inferpool on Ray Serve: V2 REST through Serve's HTTP proxy, the handle API, two replicas,
the ``serve run`` builder and replica shutdown, on a local Ray instance (tests/ray/conftest)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import joblib
import numpy as np
import pytest
import tritonclient.http as triton
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle

from inferpool.errors import BadRequest, ModelNotFound
from inferpool.ray_serve import InferpoolDeployment, build_app
from tests.ray.conftest import RayServe

# Ray's start, Serve's and each deployment's take tens of seconds on a busy 2-core machine.
pytestmark = pytest.mark.timeout(240)

MODELS = {"iris-logreg", "iris-rf", "iris-count"}  # iris-count: one test only
ROWS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5]])


@pytest.fixture(scope="module")
def iris_app(ray_serve: RayServe, ray_iris_repo: Path) -> Iterator[DeploymentHandle]:
    """The iris repository on two replicas of one worker each, at /iris."""
    settings = {"repository": str(ray_iris_repo), "num_replicas": 2, "num_cpus": 0.5}
    handle = serve.run(build_app({**settings, "workers": 1}), name="iris", route_prefix="/iris")
    ray_serve.engine_processes()
    yield handle
    serve.delete("iris")


def v2_request(rows: np.ndarray) -> dict:
    data = rows.ravel().tolist()
    return {"inputs": [{"name": "x", "shape": list(rows.shape), "datatype": "FP64", "data": data}]}


def expected(repository: Path, model: str, rows: np.ndarray) -> np.ndarray:
    return joblib.load(repository / model / "model.joblib").predict(rows)


def test_v2_infer_through_serve_proxy(
    ray_serve: RayServe, ray_iris_repo: Path, iris_app: DeploymentHandle
) -> None:
    document = {**v2_request(ROWS), "outputs": [{"name": "predict"}, {"name": "predict_proba"}]}
    response = httpx.post(f"{ray_serve.url}/iris/v2/models/iris-logreg/infer", json=document)
    assert response.status_code == 200, response.text
    outputs = {output["name"]: output for output in response.json()["outputs"]}
    assert outputs["predict"]["data"] == expected(ray_iris_repo, "iris-logreg", ROWS).tolist()
    assert outputs["predict_proba"]["shape"] == [3, 3]


def test_tritonclient_http_on_the_route_prefix(
    ray_serve: RayServe, ray_iris_repo: Path, iris_app: DeploymentHandle
) -> None:
    client = triton.InferenceServerClient(ray_serve.url.removeprefix("http://") + "/iris")
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("iris-rf")
        x = triton.InferInput("input-0", list(ROWS.shape), "FP64")
        x.set_data_from_numpy(ROWS, binary_data=True)
        wanted = [triton.InferRequestedOutput("predict", binary_data=True)]
        result = client.infer("iris-rf", [x], outputs=wanted)
        assert (
            result.as_numpy("predict").tolist() == expected(ray_iris_repo, "iris-rf", ROWS).tolist()
        )
    finally:
        client.close()


def test_health_metadata_and_errors_through_serve_proxy(
    ray_serve: RayServe, iris_app: DeploymentHandle
) -> None:
    base = f"{ray_serve.url}/iris/v2"
    assert httpx.get(f"{base}/health/live").json() == {"live": True}
    ready = httpx.get(f"{base}/health/ready")
    assert (ready.status_code, ready.json()) == (200, {"ready": True})
    metadata = httpx.get(f"{base}/models/iris-rf").json()
    assert metadata["name"] == "iris-rf"
    assert [output["name"] for output in metadata["outputs"]] == ["predict", "predict_proba"]
    assert metadata["state"] == "READY"
    names = {entry["name"] for entry in httpx.post(f"{base}/repository/index").json()}
    assert names == MODELS
    missing = httpx.post(f"{base}/models/nope/infer", json={"inputs": []})
    assert (missing.status_code, missing.json()) == (404, {"error": "model 'nope' not found"})
    bad = httpx.post(f"{base}/models/iris-rf/infer", content=b"{not json")
    assert bad.status_code == 400
    assert "error" in bad.json()


def test_handle_api(ray_iris_repo: Path, iris_app: DeploymentHandle) -> None:
    result = iris_app.infer.remote("iris-rf", ROWS, ["predict", "predict_proba"]).result()
    assert list(result) == ["predict", "predict_proba"]
    np.testing.assert_array_equal(result["predict"], expected(ray_iris_repo, "iris-rf", ROWS))
    assert result["predict_proba"].shape == (3, 3)
    frame = result.as_dataframe()
    assert list(frame.columns) == [
        "predict",
        "predict_proba_0",
        "predict_proba_1",
        "predict_proba_2",
    ]

    metadata = iris_app.model_metadata.remote("iris-logreg").result()
    assert (metadata["name"], metadata["platform"], metadata["state"]) == (
        "iris-logreg",
        "sklearn",
        "READY",
    )
    assert iris_app.ready.remote().result() == {"ready": True}
    assert {entry["name"] for entry in iris_app.models.remote().result()} == MODELS

    with pytest.raises(ModelNotFound, match="model 'nope' not found"):
        iris_app.infer.remote("nope", ROWS).result()
    with pytest.raises(BadRequest):
        iris_app.infer.remote("iris-logreg", np.array([["a", "b", "c", "d"]])).result()


def test_two_replicas_both_answer(ray_serve: RayServe, iris_app: DeploymentHandle) -> None:
    """Each replica is an engine of its own: after an odd number of requests to a model no
    other test calls, the statistics extension reports two different success counts (one
    per replica), both above zero, adding up to the requests sent."""
    base = f"{ray_serve.url}/iris/v2/models/iris-count"
    sent = 41
    document = v2_request(ROWS[:1])
    with httpx.Client() as client:
        for _ in range(sent):
            assert client.post(f"{base}/infer", json=document).status_code == 200
        counts = set()
        for _ in range(40):  # each answered by either replica
            stats = client.get(f"{base}/stats").json()["model_stats"][0]
            counts.add(stats["inference_stats"]["success"]["count"])
    assert len(counts) == 2, counts
    assert min(counts) > 0
    assert sum(counts) == sent


def test_a_model_that_fails_fails_the_deployment_with_its_reason(
    tmp_path: Path, ray_iris_repo: Path, iris_app: DeploymentHandle
) -> None:
    shutil.copytree(ray_iris_repo / "iris-rf", tmp_path / "iris-rf")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.joblib").write_bytes(b"not a model")
    app = InferpoolDeployment.options(
        name="broken", max_constructor_retry_count=1, ray_actor_options={"num_cpus": 0}
    ).bind(str(tmp_path), workers=0)
    try:
        with pytest.raises(RuntimeError, match="Deploying application broken failed"):
            serve.run(app, name="broken", route_prefix="/broken")
        status = serve.status().applications["broken"].deployments["broken"]
        assert status.status == "DEPLOY_FAILED"
        assert "model 'broken' failed to load" in status.message
    finally:
        serve.delete("broken")


def test_serve_run_builder_then_replica_shutdown_stops_the_engine(
    ray_serve: RayServe, ray_iris_repo: Path, iris_app: DeploymentHandle
) -> None:
    """``serve run inferpool.ray_serve:build_app key=value`` deploys from the command line,
    with a worker per CPU Ray gave the replica (no ``workers``); deleting the application
    shuts its replica down, and its engine's processes with it."""
    before = ray_serve.engine_processes()
    command = [
        str(Path(sys.executable).with_name("serve")), "run", "--non-blocking",
        "--address", ray_serve.gcs_address, "--name", "cli", "--route-prefix", "/cli",
        "inferpool.ray_serve:build_app",
        f"repository={ray_iris_repo}", "num_cpus=1", "max_queue=64",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=180, env=os.environ)
    assert run.returncode == 0, run.stdout + run.stderr
    assert httpx.get(f"{ray_serve.url}/cli/v2/health/ready").json() == {"ready": True}
    document = v2_request(ROWS[1:2])
    answer = httpx.post(f"{ray_serve.url}/cli/v2/models/iris-logreg/infer", json=document)
    assert answer.json()["outputs"][0]["data"] == [2]

    started = ray_serve.engine_processes() - before
    assert started, "the cli application's replica started no engine process"
    serve.delete("cli")
    deadline = time.monotonic() + 30
    while any(p.is_running() and p.status() != "zombie" for p in started):
        assert time.monotonic() < deadline, f"left running: {[p.pid for p in started]}"
        time.sleep(0.2)
    # The other application still serves.
    assert httpx.get(f"{ray_serve.url}/iris/v2/health/ready").status_code == 200


def test_build_app_arguments(ray_iris_repo: Path) -> None:
    """``serve run`` passes every argument as a string; deployment options and settings
    are told apart and checked before anything is deployed."""
    args = {"repository": str(ray_iris_repo), "num_replicas": "auto", "num_cpus": "0.5"}
    assert isinstance(build_app({**args, "workers": "2", "exit_on_error": "false"}), Application)
    with pytest.raises(ValueError, match="needs 'repository'"):
        build_app({"workers": 1})
    with pytest.raises(ValueError, match=r"unknown inferpool setting\(s\): wokers"):
        build_app({"repository": str(ray_iris_repo), "wokers": 1})
    with pytest.raises(ValueError, match="workers"):
        build_app({"repository": str(ray_iris_repo), "workers": "two"})
