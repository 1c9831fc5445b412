"""deploy/kserve/ and the server agree: each example InferenceService is rendered into the
container KServe's controller makes of the kserve-inferpool runtime for it (the facts below
are KServe's, from its controller's source), the model is generated where KServe's storage
initializer puts it, and the server runs with exactly that container's args and env: its
probes answer, the model serves V2 over REST and gRPC at the InferenceService's name, the
metrics are where the runtime's Prometheus annotations say, and (checked on the first one:
the drain settings are the runtime's) on SIGTERM readiness flips, requests are still
answered for the drain delay and the exit is 0 within the pod's grace."""

from __future__ import annotations

import copy
import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.e2e.manifest_pod import DEPLOY, IMAGE, Pod, environment, image_instructions, load
from tests.support import iris_data, write_sklearn_model
from tests.support.grpc import infer_request
from tests.support.runtimes import (
    lightgbm_estimator,
    rows_request,
    save_booster,
    xgboost_estimator,
)

RUNTIME = load("kserve/cluster-serving-runtime.yaml")[0]
SERVICES = sorted(DEPLOY.glob("kserve/inferenceservice-*.yaml"))
SERVICE_IDS = [path.stem.removeprefix("inferenceservice-") for path in SERVICES]

# KServe's SetMlServerDefaults (pkg/apis/serving/v1beta1/inference_service_defaults.go), for
# a runtime annotated serving.kserve.io/server-type: mlserver: the modelClass label of each
# format (any other gets scikit-learn's), and with a storageUri MLSERVER_MODEL_NAME (the
# InferenceService's name) and MLSERVER_MODEL_URI (where the storage initializer unpacks).
MODEL_CLASS = {
    "sklearn": "mlserver_sklearn.SKLearnModel",
    "xgboost": "mlserver_xgboost.XGBoostModel",
    "lightgbm": "mlserver_lightgbm.LightGBMModel",
    "mlflow": "mlserver_mlflow.MLflowRuntime",
}
MODEL_MOUNT = "/mnt/models"
# The autoSelect priorities of KServe's own ClusterServingRuntimes (config/runtimes/) for
# these formats in the v2 protocol. Its webhook refuses a runtime giving a format one of them.
KSERVE_PRIORITIES = {
    ("sklearn", "0"): {2},
    ("sklearn", "1"): {1, 2},
    ("xgboost", "1"): {2},
    ("xgboost", "2"): {1, 2},
    ("lightgbm", "3"): {2},
    ("lightgbm", "4"): {1, 2},
    ("mlflow", "1"): {1},
    ("mlflow", "2"): {1},
}
# Go's text/template fields as KServe's ReplacePlaceholders fills them from the metadata.
PLACEHOLDER = re.compile(r"\{\{\s*\.(\w+)(?:\.(\w+))?\s*\}\}")


def kserve_container(runtime: dict[str, Any], service: dict[str, Any]) -> dict[str, Any]:
    """The predictor container KServe's controller builds from ``runtime`` for ``service``."""
    annotations = runtime["metadata"].get("annotations", {})
    # Without it KServe passes no MLSERVER_MODEL_* and no modelClass label.
    assert annotations.get("serving.kserve.io/server-type") == "mlserver"
    meta = service["metadata"]
    model = service["spec"]["predictor"]["model"]
    model_class = MODEL_CLASS.get(model["modelFormat"]["name"], MODEL_CLASS["sklearn"])
    fields = {
        "Name": meta["name"],
        "Namespace": meta.get("namespace", "default"),
        "Labels": {**meta.get("labels", {}), "modelClass": model_class},
        "Annotations": meta.get("annotations", {}),
    }
    injected = {"MLSERVER_MODEL_NAME": meta["name"], "MLSERVER_MODEL_URI": MODEL_MOUNT}
    if "storageUri" not in model:
        injected = {"MLSERVER_LOAD_MODELS_AT_STARTUP": "false"}
    env = list(model.get("env", []))
    env += [{"name": k, "value": v} for k, v in injected.items() if k not in _names(env)]

    (container,) = (c for c in runtime["spec"]["containers"] if c["name"] == "kserve-container")
    container = copy.deepcopy(container)
    # The merge: the InferenceService's variables replace the runtime's of the same name,
    # its args follow the runtime's, its resources replace the runtime's per key.
    container["env"] = [v for v in container.get("env", []) if v["name"] not in _names(env)]
    container["env"] += env
    container["args"] = container.get("args", []) + model.get("args", [])
    for scope, amounts in model.get("resources", {}).items():
        container.setdefault("resources", {}).setdefault(scope, {}).update(amounts)

    def field(match: re.Match[str]) -> str:
        value = fields[match[1]] if match[2] is None else fields[match[1]].get(match[2])
        assert isinstance(value, str), f"{match[0]} has no value here (Go prints <no value>)"
        return value

    return json.loads(PLACEHOLDER.sub(field, json.dumps(container)))


def _names(env: list[dict[str, Any]]) -> set[str]:
    return {variable["name"] for variable in env}


def build_model(fmt: str, folder: Path) -> np.ndarray:
    """A model of ``fmt`` in ``folder`` as the storage initializer leaves it; rows for it."""
    if fmt == "sklearn":
        from sklearn.linear_model import LogisticRegression

        X, y = iris_data()
        write_sklearn_model(folder, LogisticRegression(max_iter=1000).fit(X, y))
        return X[:2]
    if fmt == "xgboost":
        model, X = xgboost_estimator("classifier")
        save_booster(folder, model.get_booster(), "model.json")
        return X[:2]
    if fmt == "lightgbm":
        model, X = lightgbm_estimator("classifier")
        save_booster(folder, model.booster_, "model.bst")
        return X[:2]
    if fmt == "mlflow":
        import mlflow.sklearn
        from sklearn.linear_model import LogisticRegression

        X, y = iris_data()
        mlflow.sklearn.save_model(
            LogisticRegression(max_iter=1000).fit(X, y),
            str(folder),
            pip_requirements=[],
            serialization_format=mlflow.sklearn.SERIALIZATION_FORMAT_CLOUDPICKLE,
        )
        return X[:2]
    raise AssertionError(f"no model builder for format {fmt!r}")


def drain_settings(container: dict[str, Any]) -> tuple[float, float]:
    values = environment(container)
    return float(values["INFERPOOL_DRAIN_DELAY"]), float(values["INFERPOOL_SHUTDOWN_TIMEOUT"])


def test_runtime_installs_beside_kserves_own() -> None:
    spec = RUNTIME["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    formats = spec["supportedModelFormats"]
    assert {(f["name"], f["version"]) for f in formats} == set(KSERVE_PRIORITIES)
    for fmt in formats:
        assert fmt["autoSelect"] is True
        # KServe's webhook: one priority per format in a runtime, and not one of its own
        # runtimes' for that format.
        assert fmt["priority"] not in KSERVE_PRIORITIES[fmt["name"], fmt["version"]]
        same_name = {f["priority"] for f in formats if f["name"] == fmt["name"]}
        assert same_name == {fmt["priority"]}


@pytest.mark.parametrize("path", SERVICES, ids=SERVICE_IDS)
def test_inferenceservice_gets_the_runtime(path: Path) -> None:
    (service,) = load(path.relative_to(DEPLOY).as_posix())
    predictor = service["spec"]["predictor"]
    model = predictor["model"]
    assert model["protocolVersion"] in RUNTIME["spec"]["protocolVersions"]
    fmt = model["modelFormat"]
    matching = [f for f in RUNTIME["spec"]["supportedModelFormats"] if f["name"] == fmt["name"]]
    matching = [f for f in matching if "version" not in fmt or f["version"] == fmt["version"]]
    assert matching, f"kserve-inferpool does not serve {fmt}"
    if "runtime" in model:
        assert model["runtime"] == RUNTIME["metadata"]["name"]
    else:  # chosen by autoSelect: above every KServe runtime's priority for the format
        best = max(max(KSERVE_PRIORITIES[f["name"], f["version"]]) for f in matching)
        assert all(f["autoSelect"] and f["priority"] > best for f in matching)
    # A ServingRuntime cannot set it: the pod's grace must outlast inferpool's drain.
    drain_delay, shutdown_timeout = drain_settings(kserve_container(RUNTIME, service))
    assert predictor["terminationGracePeriodSeconds"] > drain_delay + shutdown_timeout


def test_runtime_runs_the_image_as_built() -> None:
    """The runtime spells out the image's CMD, under its ENTRYPOINT (tini), as its user."""
    image = image_instructions()
    container = RUNTIME["spec"]["containers"][0]
    assert container["image"] == IMAGE
    assert "inferpool" not in json.loads(image["ENTRYPOINT"])
    assert json.loads(image["CMD"]) == container["args"]
    # runAsNonRoot needs the image's user as a number; the manifest names the same one.
    assert container["securityContext"]["runAsUser"] == int(image["USER"].partition(":")[0])


@pytest.mark.parametrize("path", SERVICES, ids=SERVICE_IDS)
def test_kserve_pod_serves_the_inferenceservice(path: Path, tmp_path: Path) -> None:
    (service,) = load(path.relative_to(DEPLOY).as_posix())
    name = service["metadata"]["name"]
    container = kserve_container(RUNTIME, service)
    rows = build_model(service["spec"]["predictor"]["model"]["modelFormat"]["name"], tmp_path)
    pod = Pod(container, mounts={MODEL_MOUNT: tmp_path})
    grace = service["spec"]["predictor"]["terminationGracePeriodSeconds"]
    drain_delay, _ = drain_settings(container)
    annotations = RUNTIME["spec"]["annotations"]

    with pod.running() as server:
        server.wait_for(pod.probe_url("startupProbe"), timeout=240)
        server.wait_for(pod.probe_url("readinessProbe"))
        server.wait_for(pod.probe_url("livenessProbe"))
        metrics = server.wait_for(
            pod.url(int(annotations["prometheus.kserve.io/port"]))
            + annotations["prometheus.kserve.io/path"]
        )
        assert "inferpool" in metrics.text

        infer_url = pod.url("http1", f"/v2/models/{name}/infer")
        response = httpx.post(infer_url, json=rows_request(rows), timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["model_name"] == name and response.json()["outputs"]
        with grpc.insecure_channel(pod.url("h2c").removeprefix("http://")) as channel:
            reply = GRPCInferenceServiceStub(channel).ModelInfer(
                infer_request(name, **{"input-0": rows}), timeout=30
            )
        assert reply.model_name == name and reply.outputs
        if service["spec"]["predictor"]["model"]["protocolVersion"] == "v1":
            v1_url = pod.url("http1", f"/v1/models/{name}:predict")
            response = httpx.post(v1_url, json={"instances": rows.tolist()}, timeout=30)
            assert response.status_code == 200, response.text
            assert len(response.json()["predictions"]) == len(rows)
        if path != SERVICES[0]:
            return  # the drain is the runtime's, the same for every InferenceService

        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        ready = pod.probe_url("readinessProbe")
        while httpx.get(ready, timeout=2).status_code != 503:
            assert time.monotonic() - signalled < 2, "readiness still 200 after SIGTERM"
        # Kubernetes is still removing the endpoint: requests keep being answered.
        response = httpx.post(infer_url, json=rows_request(rows), timeout=30)
        assert response.status_code == 200, response.text
        assert time.monotonic() - signalled < drain_delay
        assert server.process.wait(grace) == 0, server.output()
        assert time.monotonic() - signalled >= drain_delay
