"""Repository layouts end to end: nested folders, a broken folder beside good ones,
MLServer's versions side by side, Triton's numbered versions; requests by version and
unversioned (the latest READY version) over REST, gRPC and tritonclient; the index per
version; unload and load by name."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from sklearn.dummy import DummyClassifier

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, iris_data, write_sklearn_model
from tests.support.grpc import WORKER_COUNTS, infer_request, stub_for

ROWS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]])
BODY = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP64", "data": ROWS.tolist()}]}


def constant(folder: Path, label: int, filename: str = "model.joblib") -> Path:
    """A classifier that answers ``label`` for every row: which version ran shows."""
    X, y = iris_data()
    return write_sklearn_model(
        folder, DummyClassifier(strategy="constant", constant=label).fit(X, y), filename
    )


def settings(folder: Path, **document: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-settings.json").write_text(json.dumps(document))


def build_layouts(root: Path) -> Path:
    # A model two folders down (MLServer's recursive glob), inside a folder of models.
    constant(root / "group" / "nested", 1)
    settings(root / "group" / "nested", name="nested")
    # MLServer's versions side by side: one name, two folders; a third version fails.
    for version, label in (("v1", 0), ("v2", 2)):
        constant(root / f"iris-{version}", label)
        settings(root / f"iris-{version}", name="iris", parameters={"version": version})
    settings(root / "iris-v3", name="iris", parameters={"version": "v3"})
    (root / "iris-v3" / "model.joblib").write_bytes(b"not a pickle")
    # A second folder (in path order) with a name and version already served fails,
    # naming the first.
    constant(root / "iris-v1-copy", 1)
    settings(root / "iris-v1-copy", name="iris", parameters={"version": "v1"})
    # Triton's numbered versions: settings of the model folder, files in each version
    # (10 is newer than 9: numbers compare as numbers).
    constant(root / "triton" / "9", 0, "clf.joblib")
    constant(root / "triton" / "10", 1, "clf.joblib")
    settings(root / "triton", parameters={"uri": "./clf.joblib"})
    # And without any settings file.
    constant(root / "bare" / "1", 2)
    # A folder that cannot be read.
    (root / "broken").mkdir()
    (root / "broken" / "model-settings.json").write_text("{not json")
    return root


def predict(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


@pytest.mark.parametrize("workers", WORKER_COUNTS)
def test_every_layout_serves_each_version(tmp_path: Path, workers: int) -> None:
    repository = build_layouts(tmp_path)
    flags = ("--workers", str(workers), "--no-exit-on-error")
    with Server(repository, *flags) as server:
        server.wait_live()
        url = f"{server.url}/v2/models"
        # The broken folders keep the server not ready (strict), never from serving.
        # Every model that can serve is READY before any is asked (they load in turn).
        serving = ("bare", "nested", "iris/versions/v1", "iris/versions/v2", "triton/versions/9")
        for _ in range(600):
            states = [httpx.get(f"{url}/{name}/ready").status_code for name in serving]
            index = httpx.post(f"{server.url}/v2/repository/index", json={}).json()
            if set(states) == {200} and all(e["state"] != "LOADING" for e in index):
                break
            time.sleep(0.1)
        assert set(states) == {200}, server.output()
        not_ready = httpx.get(f"{server.url}/v2/health/ready")
        assert not_ready.status_code == 503

        assert predict(httpx.post(f"{url}/nested/infer", json=BODY)) == [1, 1]
        # Unversioned: the latest READY version (v3 failed); by version: that one.
        latest = httpx.post(f"{url}/iris/infer", json=BODY)
        assert predict(latest) == [2, 2] and latest.json()["model_version"] == "v2"
        assert predict(httpx.post(f"{url}/iris/versions/v1/infer", json=BODY)) == [0, 0]
        assert predict(httpx.post(f"{url}/iris/versions/v2/infer", json=BODY)) == [2, 2]
        failed = httpx.post(f"{url}/iris/versions/v3/infer", json=BODY)
        assert failed.status_code == 503 and "v3" in failed.json()["error"]
        absent = httpx.post(f"{url}/iris/versions/v9/infer", json=BODY)
        assert absent.status_code == 404 and "v9" in absent.json()["error"]
        assert predict(httpx.post(f"{url}/triton/infer", json=BODY)) == [1, 1]
        assert predict(httpx.post(f"{url}/triton/versions/9/infer", json=BODY)) == [0, 0]
        assert predict(httpx.post(f"{url}/bare/versions/1/infer", json=BODY)) == [2, 2]

        # Readiness and metadata per version and unversioned.
        assert httpx.get(f"{url}/iris/ready").status_code == 200
        assert httpx.get(f"{url}/iris/versions/v1/ready").status_code == 200
        assert httpx.get(f"{url}/iris/versions/v3/ready").status_code != 200
        metadata = httpx.get(f"{url}/iris").json()
        assert metadata["versions"] == ["v1", "v2", "v3"] and metadata["state"] == "READY"
        assert httpx.get(f"{url}/triton/versions/9").json()["versions"] == ["10", "9"]
        stats = httpx.get(f"{url}/iris/versions/v1/stats").json()["model_stats"]
        assert [(s["name"], s["version"]) for s in stats] == [("iris", "v1")]
        assert stats[0]["inference_stats"]["success"]["count"] == 1
        every = httpx.get(f"{url}/iris/stats").json()["model_stats"]
        assert sorted(s["version"] for s in every) == ["v1", "v2", "v3"]

        # The index: one entry per version, the failed folders with their reasons.
        index = httpx.post(f"{server.url}/v2/repository/index", json={}).json()
        entries = {(e["name"], e.get("version")): e for e in index}
        for key in [("iris", "v1"), ("iris", "v2"), ("triton", "9"), ("triton", "10")]:
            assert entries[key]["state"] == "READY", entries
        assert entries[("nested", None)]["state"] == "READY"
        assert entries[("iris", "v3")]["state"] == "FAILED"
        assert entries[("broken", None)]["state"] == "FAILED"
        assert "not valid JSON" in entries[("broken", None)]["reason"]
        copy = entries[("iris-v1-copy", None)]
        assert copy["state"] == "FAILED" and "iris-v1" in copy["reason"], copy

        # gRPC: model_version "" is the latest READY, a named one that version.
        with stub_for(server) as stub:
            for version, label in (("", 2), ("v1", 0), ("v2", 2)):
                request = infer_request("iris", x=ROWS)
                request.model_version = version
                answer = stub.ModelInfer(request, timeout=30)
                assert answer.model_version == (version or "v2")
                assert list(answer.outputs[0].contents.int64_contents) == [label] * 2
            ready = stub.ModelReady(pb.ModelReadyRequest(name="iris", version="v1"), timeout=30)
            assert ready.ready
            metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name="triton"), timeout=30)
            assert list(metadata.versions) == ["10", "9"]

        # tritonclient, over both protocols.
        http_client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        grpc_client = triton_grpc.InferenceServerClient(server.grpc_address)
        for module, client in ((triton_http, http_client), (triton_grpc, grpc_client)):
            x = module.InferInput("x", list(ROWS.shape), "FP64")
            x.set_data_from_numpy(ROWS)
            for version, label in (("", 2), ("v1", 0)):
                result = client.infer("iris", [x], model_version=version)
                assert result.as_numpy("predict").tolist() == [label] * 2
            result = client.infer("triton", [x], model_version="9")
            assert result.as_numpy("predict").tolist() == [0, 0]
            assert client.is_model_ready("triton", "10")
        http_client.close()
        grpc_client.close()


@pytest.mark.parametrize("workers", WORKER_COUNTS)
def test_unload_and_load_by_name_take_every_version(tmp_path: Path, workers: int) -> None:
    for version, label in (("v1", 0), ("v2", 2)):
        constant(tmp_path / "models" / f"iris-{version}", label)
        settings(
            tmp_path / "models" / f"iris-{version}", name="iris", parameters={"version": version}
        )
    constant(tmp_path / "models" / "other", 1)
    with Server(tmp_path / "models", "--workers", str(workers)) as server:
        server.wait_ready()
        api = f"{server.url}/v2/repository/models/iris"
        assert httpx.post(f"{api}/unload").status_code == 200
        # Every version stays listed, UNAVAILABLE with MLServer's empty reason, and answers 404.
        index = httpx.post(f"{server.url}/v2/repository/index", json={}).json()
        unloaded = {(e["name"], e.get("version"), e["state"], e["reason"]) for e in index}
        assert unloaded == {
            ("iris", "v1", "UNAVAILABLE", ""),
            ("iris", "v2", "UNAVAILABLE", ""),
            ("other", None, "READY", ""),
        }
        assert httpx.post(f"{server.url}/v2/models/iris/infer", json=BODY).status_code == 404

        # A version removed from the repository is not loaded again (nor listed); a new
        # one is.
        (tmp_path / "models" / "iris-v1").rename(tmp_path / "iris-v1")
        constant(tmp_path / "models" / "iris-v10", 1)
        settings(tmp_path / "models" / "iris-v10", name="iris", parameters={"version": "10"})
        settings(tmp_path / "models" / "iris-v2", name="iris", parameters={"version": "2"})
        assert httpx.post(f"{api}/load", timeout=120).status_code == 200
        index = httpx.post(f"{server.url}/v2/repository/index", json={}).json()
        versions = sorted(entry.get("version", "") for entry in index if entry["name"] == "iris")
        assert versions == ["10", "2"]
        latest = httpx.post(f"{server.url}/v2/models/iris/infer", json=BODY)
        assert predict(latest) == [1, 1] and latest.json()["model_version"] == "10"
        older = httpx.post(f"{server.url}/v2/models/iris/versions/2/infer", json=BODY)
        assert predict(older) == [2, 2]
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
