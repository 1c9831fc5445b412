"""The command line: ``--help`` lists every setting; ``--demo`` trains and serves."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from inferpool.settings import ServerSettings
from tests.support import Server, free_port


def test_help_lists_every_server_setting():
    result = subprocess.run(
        [sys.executable, "-m", "inferpool", "serve", "--help"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    for name in ServerSettings.model_fields:
        if name != "model_repository":
            assert "--" + name.replace("_", "-") in result.stdout
    assert "INFERPOOL_HTTP_PORT" in result.stdout


def test_demo_trains_and_serves_iris_models():
    with Server(None, "--demo", "--workers", "0") as server:
        server.wait_ready(timeout=120)
        models = httpx.post(f"{server.url}/v2/repository/index").json()
        assert {m["name"] for m in models} == {"iris-logreg", "iris-rf"}
        body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                            "data": [5.1, 3.5, 1.4, 0.2, 6.7, 3.0, 5.2, 2.3]}]}  # fmt: skip
        for name in ("iris-logreg", "iris-rf"):
            output = httpx.post(f"{server.url}/v2/models/{name}/infer", json=body).json()
            assert output["outputs"][0]["data"] == [0, 2]


def test_settings_file_then_environment_pick_the_port(tmp_path, iris_repo):
    """settings.json names one port, INFERPOOL_HTTP_PORT another: the environment wins."""
    import os
    import shutil
    import time

    repo = tmp_path / "repo"
    shutil.copytree(iris_repo, repo)
    file_port, env_port = free_port(), free_port()
    (repo / "settings.json").write_text(json.dumps({"http_port": file_port, "grpc_port": 0}))
    command = [sys.executable, "-m", "inferpool", "serve", str(repo), "--host", "127.0.0.1",
               "--metrics-port", "0", "--workers", "0"]  # fmt: skip
    env = {**os.environ, "INFERPOOL_HTTP_PORT": str(env_port)}
    process = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + 60
        ready = None
        while time.monotonic() < deadline and ready != 200:
            try:
                ready = httpx.get(f"http://127.0.0.1:{env_port}/v2/health/ready").status_code
            except httpx.HTTPError:
                time.sleep(0.1)
        assert ready == 200
        try:
            httpx.get(f"http://127.0.0.1:{file_port}/v2/health/live", timeout=2)
            raise AssertionError("the settings.json port should not be served")
        except httpx.ConnectError:
            pass
    finally:
        process.terminate()
        assert process.wait(60) == 0
