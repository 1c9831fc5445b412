"""deploy/seldon/ and the server agree: inferpool runs with the ServerConfig's container args
and env, and Seldon Core v2's agent's calls (the facts below are the agent's, from
scheduler/pkg/agent in Seldon's source) work against it, over the protocol the agent uses:
gRPC ServerLive until live, RepositoryIndex (unloading what is READY or LOADING), the model
folder written as the agent writes it, RepositoryModelLoad, inference proxied at the
versioned name over REST and gRPC, a second load (the agent's lazy reload on a 404),
RepositoryModelUnload and the folder removed."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from sklearn.linear_model import LogisticRegression

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.e2e.manifest_pod import IMAGE, Pod, environment, image_instructions, load
from tests.support import iris_data, write_sklearn_model
from tests.support.grpc import infer_request
from tests.support.runtimes import rows_request

(SERVER_CONFIG,) = load("seldon/serverconfig.yaml")
(SERVER,) = load("seldon/server.yaml")
POD_SPEC = SERVER_CONFIG["spec"]["podSpec"]
CONTAINERS = {container["name"]: container for container in POD_SPEC["containers"]}
AGENT = CONTAINERS["agent"]
# The agent's --agent-folder default; it keeps the models in its "models" subfolder.
AGENT_FOLDER = "/mnt/agent"
# The agent's model-settings.json for a Model requiring "sklearn" (settings.go), after
# updateNameAndVersion: "<model>_<version>" and the pinned artefact version 1.
MODEL = "iris_1"
MODEL_SETTINGS = {
    "name": MODEL,
    "implementation": "mlserver_sklearn.SKLearnModel",
    "parameters": {"uri": "./model.joblib", "version": "1"},
}


def server_container() -> dict[str, Any]:
    """The container the agent reaches at SELDON_SERVER_HTTP_PORT and _GRPC_PORT."""
    agent = environment(AGENT, POD_SPEC["containers"])
    wanted = {int(agent["SELDON_SERVER_HTTP_PORT"]), int(agent["SELDON_SERVER_GRPC_PORT"])}
    (found,) = (
        c for c in POD_SPEC["containers"] if wanted <= {p["containerPort"] for p in c["ports"]}
    )
    return found


def test_serverconfig_wires_the_agent_to_inferpool() -> None:
    agent = environment(AGENT, POD_SPEC["containers"])
    assert agent["SELDON_SERVER_TYPE"] == "mlserver"  # the agent writes model-settings.json
    assert not any(a.startswith("--agent-folder") for a in AGENT.get("args", []))
    server = server_container()
    assert server["name"] == "inferpool" and server["image"] == IMAGE
    user = image_instructions()["USER"].partition(":")[0]
    assert POD_SPEC["securityContext"]["runAsUser"] == int(user)
    (memory,) = (v for v in AGENT["env"] if v["name"] == "MEMORY_REQUEST")
    assert memory["valueFrom"]["resourceFieldRef"]["containerName"] == server["name"]
    # Both mount the same volume: the agent at its folder, inferpool under it.
    agent_mounts = {m["name"]: m["mountPath"] for m in AGENT["volumeMounts"]}
    (shared,) = (m for m in server["volumeMounts"] if agent_mounts.get(m["name"]) == AGENT_FOLDER)
    assert server["args"][-1] == f"{shared['mountPath']}/models"
    # Seldon places Models by these: the runtimes the image carries, and its own name.
    capabilities = agent["SELDON_SERVER_CAPABILITIES"].split(",")
    assert {"inferpool", "sklearn", "xgboost", "lightgbm", "mlflow"} <= set(capabilities)
    assert SERVER["spec"]["serverConfig"] == SERVER_CONFIG["metadata"]["name"]
    drain = float(environment(server)["INFERPOOL_DRAIN_DELAY"])
    shutdown = float(environment(server)["INFERPOOL_SHUTDOWN_TIMEOUT"])
    assert POD_SPEC["terminationGracePeriodSeconds"] > drain + shutdown


def test_seldon_agent_drives_inferpool(tmp_path: Path) -> None:
    server = server_container()
    pod = Pod(server, mounts={AGENT_FOLDER: tmp_path})
    models = tmp_path / "models"  # the agent makes it when it starts, maybe after inferpool
    agent_env = environment(AGENT, POD_SPEC["containers"])
    http_port = int(agent_env["SELDON_SERVER_HTTP_PORT"])
    grpc_port = int(agent_env["SELDON_SERVER_GRPC_PORT"])

    with pod.running() as process:
        process.wait_for(pod.probe_url("startupProbe"), timeout=240)
        process.wait_for(pod.probe_url("readinessProbe"))  # ready with no model
        process.wait_for(pod.probe_url("livenessProbe"))
        channel = grpc.insecure_channel(pod.url(grpc_port).removeprefix("http://"))
        stub = GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
        # UnloadAllModels at the agent's start: nothing is READY or LOADING.
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10)
        assert not [m for m in index.models if m.state in ("READY", "LOADING")]

        X, y = iris_data()
        folder = models / MODEL / "1"
        write_sklearn_model(folder, LogisticRegression(max_iter=1000).fit(X, y))
        (folder / "model-settings.json").write_text(json.dumps(MODEL_SETTINGS))
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=MODEL), timeout=120)
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10)
        assert {(m.name, m.state) for m in index.models} == {(MODEL, "READY")}

        # The agent's reverse proxies: the REST path rewritten to the versioned name (any
        # /versions/N dropped), the gRPC request's model_name set and model_version emptied.
        infer_url = pod.url(http_port, f"/v2/models/{MODEL}/infer")
        response = httpx.post(infer_url, json=rows_request(X[:2]), timeout=30)
        assert response.status_code == 200, response.text
        reply = stub.ModelInfer(infer_request(MODEL, **{"input-0": X[:2]}), timeout=30)
        assert reply.model_name == MODEL and reply.outputs
        assert stub.ModelReady(pb.ModelReadyRequest(name=MODEL, version=""), timeout=10).ready
        metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name=MODEL), timeout=10)
        assert metadata.name == MODEL

        # On a 404 or 400 the proxy loads the model again and retries: a loaded model's load
        # succeeds and it keeps serving.
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=MODEL), timeout=120)
        response = httpx.post(infer_url, json=rows_request(X[:2]), timeout=30)
        assert response.status_code == 200, response.text

        stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=MODEL), timeout=60)
        for path in sorted(folder.parent.rglob("*"), reverse=True):  # the agent's RemoveAll
            path.unlink() if path.is_file() else path.rmdir()
        folder.parent.rmdir()
        # Unloaded: listed UNAVAILABLE until something notices its folder went (Triton's
        # index); the agent sends it nothing more. A request that still came would be a
        # 404, as MLServer answers: the one status on which the agent loads it again.
        assert httpx.post(infer_url, json=rows_request(X[:2]), timeout=30).status_code == 404
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10)
        assert not [m for m in index.models if m.state in ("READY", "LOADING")]
        # The agent takes NOT_FOUND on an unload as done.
        with pytest.raises(grpc.RpcError) as error:
            stub.RepositoryModelUnload(
                pb.RepositoryModelUnloadRequest(model_name=MODEL), timeout=10
            )
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        channel.close()

        # The pod stops within its grace (the agent's preStop has moved the models away).
        process.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        grace = POD_SPEC["terminationGracePeriodSeconds"]
        assert process.process.wait(grace) == 0, process.output()
        assert time.monotonic() - signalled < grace
