"""Model settings as MLServer users bring them (issue 13, points 2 and 3): single-model
mode from ``MLSERVER_MODEL_*`` (as KServe's MLServer runtime sets it) and
``INFERPOOL_MODEL_*``; unknown keys warn naming the key and file; a setting inferpool does
not implement fails that model with its reason; environment_tarball is read
(engine/environments/unpack.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from sklearn.linear_model import LogisticRegression

from inferpool.engine.repository import discover
from inferpool.mlserver.contract import common as mlserver_common
from inferpool.settings import read_model_settings
from tests.support import Server, iris_data, write_sklearn_model

BODY = {
    "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [6.7, 3.0, 5.2, 2.3]}]
}
KSERVE = {  # what KServe's kserve-mlserver runtime and its defaulting webhook set
    "MLSERVER_MODEL_IMPLEMENTATION": "mlserver_sklearn.SKLearnModel",
    "MLSERVER_MODEL_NAME": "my-isvc",
    "MLSERVER_HTTP_PORT": "8080",
    "MLSERVER_GRPC_PORT": "9000",
}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mlserver_common, "_logged", set())
    for name in os.environ:
        if name.startswith(("MLSERVER_", "INFERPOOL_")):
            monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def artefact_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """KServe's /mnt/models: the artefact at the root, no model-settings.json."""
    X, y = iris_data()
    return write_sklearn_model(
        tmp_path_factory.mktemp("mnt") / "models", LogisticRegression(max_iter=1000).fit(X, y)
    )


def test_single_model_mode_serves_the_artefact_at_the_root(artefact_root: Path) -> None:
    env = {**KSERVE, "MLSERVER_MODEL_URI": str(artefact_root)}
    with Server(artefact_root, "--workers", "0", env=env) as server:
        server.wait_ready()
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        assert [(m["name"], m["state"]) for m in index] == [("my-isvc", "READY")]
        answer = httpx.post(f"{server.url}/v2/models/my-isvc/infer", json=BODY, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [2]


def test_single_model_mode_without_a_repository_serves_the_uri_and_inferpool_wins(
    artefact_root: Path,
) -> None:
    env = {
        **KSERVE,
        "MLSERVER_MODEL_URI": str(artefact_root / "model.joblib"),
        "INFERPOOL_MODEL_NAME": "ours",  # wins over MLSERVER_MODEL_NAME
        "MLSERVER_MODEL_VERSION": "v7",
    }
    with Server(None, "--workers", "0", env=env) as server:
        server.wait_ready()
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        assert [(m["name"], m.get("version")) for m in index] == [("ours", "v7")]
        answer = httpx.post(f"{server.url}/v2/models/ours/infer", json=BODY, timeout=30)
        assert answer.status_code == 200, answer.text


def test_model_variables_are_read_as_mlserver_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLSERVER_MODEL_NAME", "m")
    monkeypatch.setenv("MLSERVER_MODEL_EXTRA", '{"tree_kernel": false}')
    monkeypatch.setenv("MLSERVER_MODEL_CONTENT_TYPE", "pd")
    monkeypatch.setenv("MLSERVER_MODEL_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("INFERPOOL_MODEL_MAX_BATCH_SIZE", "16")
    [found] = discover(tmp_path)
    assert found.settings is not None, found.error
    assert found.settings.parameters.extra == {"tree_kernel": False}
    assert found.settings.parameters.content_type == "pd"
    assert found.settings.max_batch_size == 16 and found.settings.folder == tmp_path
    # A repository with settings files is read from them: the environment's model is
    # MLServer's fallback only.
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model-settings.json").write_text('{"name": "a"}')
    assert [d.name for d in discover(tmp_path)] == ["a"]


def test_model_variables_fill_what_a_settings_file_leaves_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As MLServer reads every model-settings.json: the file's keys win, the environment's
    fill the others (KServe's MLSERVER_MODEL_NAME names a file's model that has no name)."""
    (tmp_path / "model-settings.json").write_text(
        json.dumps({"implementation": "my_runtime.Custom", "parameters": {"version": "v1"}})
    )
    monkeypatch.setenv("MLSERVER_MODEL_NAME", "my-isvc")
    monkeypatch.setenv("MLSERVER_MODEL_IMPLEMENTATION", "mlserver_sklearn.SKLearnModel")
    monkeypatch.setenv("MLSERVER_MODEL_EXTRA", '{"a": 1}')
    monkeypatch.setenv("INFERPOOL_MODEL_VERSION", "v2")
    settings = read_model_settings(tmp_path, "folder")
    assert settings.name == "my-isvc" and settings.implementation == "my_runtime.Custom"
    assert settings.version == "v1" and settings.parameters.extra == {"a": 1}


def test_single_model_reads_its_environment_tarball(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLSERVER_MODEL_NAME", "m")
    monkeypatch.setenv("MLSERVER_MODEL_ENVIRONMENT_TARBALL", "./env.tar.gz")
    [found] = discover(tmp_path)
    assert found.name == "m" and found.settings is not None, found.error
    assert found.settings.parameters.model_extra == {"environment_tarball": "./env.tar.gz"}


def test_unknown_and_refused_keys_of_model_settings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "model-settings.json"
    path.write_text(
        json.dumps(
            {
                "name": "m",
                "platfrom": "sklearn",
                "warm_workers": True,
                "cache_enabled": False,  # MLServer's default: nothing to say
                "parameters": {"uri": "./model.joblib", "colour": "blue", "format": None},
            }
        )
    )
    read_model_settings(tmp_path, "m")
    assert f"{path}: unknown key 'platfrom'" in caplog.text
    assert f"{path}: unknown key 'parameters.colour'" in caplog.text
    assert "warm_workers=True is not implemented" in caplog.text
    assert "cache_enabled" not in caplog.text and "format" not in caplog.text
    caplog.clear()
    path.write_text(json.dumps({"parameters": {"environment_path": "/opt/env"}}))
    read_model_settings(tmp_path, "m")  # read as it is (engine/environments/unpack.py)
    assert "environment_path" not in caplog.text


def test_platform_and_versions_warn_that_mlmodel_runtimes_read_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """MLServer's streaming example sets both; an MLModel's metadata() answers them, so
    the warning says who reads them rather than that they are ignored."""
    path = tmp_path / "model-settings.json"
    settings = {"name": "m", "platform": "mlserver", "versions": ["m/v1.2.3"]}
    path.write_text(json.dumps(settings))
    read_model_settings(tmp_path, "m")
    for shown in ("platform='mlserver'", "versions=['m/v1.2.3']"):
        line = next(line for line in caplog.text.splitlines() if shown in line)
        assert "read by MLModel runtimes only" in line and "ignored" not in line, line
        assert "inferpool's own runtimes ignore it" in line


def test_unknown_keys_warn_and_a_tarball_fails_only_its_model(tmp_path: Path) -> None:
    """A real server: warnings name the key and file; the tarball's model is FAILED with
    its reason in the index (its tarball is missing) while the other model serves."""
    X, y = iris_data()
    estimator = LogisticRegression(max_iter=1000).fit(X, y)
    good, packed = tmp_path / "good", tmp_path / "packed"
    write_sklearn_model(good, estimator)
    write_sklearn_model(packed, estimator)
    (good / "model-settings.json").write_text(
        json.dumps(
            {"name": "good", "implementaton": "typo", "parameters": {"uri": "./model.joblib"}}
        )
    )
    (packed / "model-settings.json").write_text(
        json.dumps({"name": "packed", "parameters": {"environment_tarball": "./env.tar.gz"}})
    )
    (tmp_path / "settings.json").write_text(json.dumps({"parallel_wokers": 2}))
    with Server(tmp_path, "--workers", "0", "--no-exit-on-error") as server:
        server.wait_live()
        index = _wait_settled(server)
        assert index["good"]["state"] == "READY"
        assert index["packed"]["state"] == "FAILED"
        reason = index["packed"]["reason"]
        assert reason == f"environment {packed / 'env.tar.gz'} does not exist"
        answer = httpx.post(f"{server.url}/v2/models/good/infer", json=BODY, timeout=30)
        assert answer.status_code == 200, answer.text
        output = server.output()
    assert f"{good / 'model-settings.json'}: unknown key 'implementaton'" in output
    assert f"{tmp_path / 'settings.json'}: parallel_wokers: unknown setting" in output


def _wait_settled(server: Server, timeout: float = 60) -> dict[str, dict]:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        if index and all(m["state"] in ("READY", "FAILED") for m in index):
            return {m["name"]: m for m in index}
        time.sleep(0.1)
    raise TimeoutError(server.output())


def test_the_repository_api_unloads_and_loads_the_environments_model(artefact_root: Path) -> None:
    env = {**KSERVE, "MLSERVER_MODEL_URI": str(artefact_root)}
    with Server(artefact_root, "--workers", "0", env=env) as server:
        server.wait_ready()
        unloaded = httpx.post(f"{server.url}/v2/repository/models/my-isvc/unload", timeout=60)
        assert unloaded.status_code == 200, unloaded.text
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        assert [(m["name"], m["state"]) for m in index] == [("my-isvc", "UNAVAILABLE")]
        answer = httpx.post(f"{server.url}/v2/models/my-isvc/infer", json=BODY, timeout=30)
        assert answer.status_code == 404, answer.text
        loaded = httpx.post(f"{server.url}/v2/repository/models/my-isvc/load", timeout=60)
        assert loaded.status_code == 200, loaded.text
        answer = httpx.post(f"{server.url}/v2/models/my-isvc/infer", json=BODY, timeout=30)
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [2]
