"""MLServer's environment contract (issue 13, point 2): ``MLSERVER_*`` server variables
mapped onto inferpool's settings, below ``INFERPOOL_*`` and flags; settings MLServer has
and inferpool does not implement refused with a reason, never ignored."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from inferpool.cli import main
from inferpool.mlserver.contract import common as mlserver_common
from inferpool.settings import load_server_settings
from tests.support import Server, free_port


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each test sees its own warnings (they are logged once per process).
    monkeypatch.setattr(mlserver_common, "_logged", set())
    for name in os.environ:
        if name.startswith(("MLSERVER_", "INFERPOOL_")):
            monkeypatch.delenv(name)


def test_mlserver_variables_sit_under_settings_file_and_inferpool_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "settings.json").write_text(
        json.dumps({"http_port": 9001, "grpc_port": 9002, "metrics_port": 9003, "host": "h"})
    )
    monkeypatch.setenv("MLSERVER_HTTP_PORT", "7001")  # under the file, as in MLServer
    monkeypatch.setenv("MLSERVER_GRPC_PORT", "7002")
    monkeypatch.setenv("INFERPOOL_GRPC_PORT", "6002")  # INFERPOOL_* over MLSERVER_*
    monkeypatch.setenv("MLSERVER_METRICS_PORT", "7003")
    monkeypatch.setenv("MLSERVER_PARALLEL_WORKERS", "3")
    monkeypatch.setenv("MLSERVER_GRPC_MAX_MESSAGE_LENGTH", "1000")
    monkeypatch.setenv("MLSERVER_CORS_SETTINGS", '{"allow_origins": ["https://a.example"]}')
    settings = load_server_settings(tmp_path, {"metrics_port": 5003})  # a flag over both
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (9001, 6002, 5003)
    assert settings.host == "h" and settings.workers == 3 and settings.max_body_bytes == 1000
    assert settings.cors_settings is not None
    assert settings.cors_settings.allow_origins == ["https://a.example"]
    assert settings.cors_settings.allow_methods == ["GET"]  # MLServer's default


def test_mlserver_settings_file_keys_are_mapped(tmp_path: Path) -> None:
    (tmp_path / "settings.json").write_text(
        json.dumps(
            {
                "debug": True,
                "parallel_workers": 0,
                "metrics_endpoint": None,
                "load_models_at_startup": False,
                "cors_settings": {"allow_origins": ["*"], "max_age": None},
            }
        )
    )
    settings = load_server_settings(tmp_path, {})
    assert settings.log_level == "debug" and settings.access_log  # MLServer's debug
    assert settings.workers == 0 and settings.metrics_port == -1
    assert not settings.load_models_at_startup and settings.allow_empty
    assert settings.cors_settings is not None and settings.cors_settings.max_age == 600


def test_models_dir_and_repository_root_name_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, models = tmp_path / "root", tmp_path / "models"
    root.mkdir()
    models.mkdir()
    monkeypatch.setenv("MLSERVER_MODEL_REPOSITORY_ROOT", str(root))
    assert load_server_settings(None, {}).model_repository == root
    monkeypatch.setenv("MLSERVER_MODELS_DIR", str(models))  # the image's argument wins
    assert load_server_settings(None, {}).model_repository == models
    monkeypatch.setenv("INFERPOOL_MODEL_REPOSITORY", str(root))
    assert load_server_settings(None, {}).model_repository == root


def test_harmless_unimplemented_settings_warn_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MLSERVER_CACHE_ENABLED", "true")
    monkeypatch.setenv("MLSERVER_KAFKA_ENABLED", "false")  # what inferpool does: no word
    monkeypatch.setenv("MLSERVER_SERVRE_NAME", "typo")
    with caplog.at_level(logging.WARNING, "inferpool.settings"):
        load_server_settings(tmp_path, {})
    text = caplog.text
    assert "MLSERVER_CACHE_ENABLED=True is not implemented" in text
    assert "caches no responses" in text
    assert "unknown variable MLSERVER_SERVRE_NAME" in text
    assert "KAFKA" not in text


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("MLSERVER_KAFKA_ENABLED", "true", "no Kafka server"),
        ("MLSERVER_ROOT_PATH", "/prefix", "served at /"),
        ("MLSERVER_METRICS_ENDPOINT", "/prom", "at /metrics only"),
        ("MLSERVER_MODEL_REPOSITORY_IMPLEMENTATION", "my.Repo", "custom repository class"),
        ("MLSERVER_HTTP_PORT", "eighty", "integer"),
    ],
)
def test_settings_that_would_serve_differently_stop_the_start(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    reason: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["serve", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert variable in error and reason in error


def test_an_environment_tarball_runs_every_model_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MLServer's image sets MLSERVER_ENV_TARBALL by default and skips a missing file.
    monkeypatch.setenv("MLSERVER_ENV_TARBALL", "environment.tar.gz")
    monkeypatch.chdir(tmp_path)
    assert load_server_settings(tmp_path, {}).environment_tarball is None
    (tmp_path / "environment.tar.gz").write_bytes(b"")
    settings = load_server_settings(tmp_path, {"workers": 3})
    # Absolute (the directory the server started in), with as many workers as the server.
    assert settings.environment_tarball == tmp_path / "environment.tar.gz"
    assert settings.environment_workers == 3
    given = load_server_settings(tmp_path, {"workers": 3, "environment_workers": 1})
    assert given.environment_workers == 1
    # inferpool's own names for it win over MLServer's variable.
    (tmp_path / "settings.json").write_text(json.dumps({"environment_tarball": "/envs/a.tgz"}))
    assert load_server_settings(tmp_path, {}).environment_tarball == Path("/envs/a.tgz")
    monkeypatch.setenv("INFERPOOL_ENVIRONMENT_TARBALL", "/envs/b.tgz")
    assert load_server_settings(tmp_path, {}).environment_tarball == Path("/envs/b.tgz")


def test_an_environment_tarball_without_workers_stops_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "environment.tar.gz").write_bytes(b"")
    monkeypatch.setenv("MLSERVER_ENV_TARBALL", str(tmp_path / "environment.tar.gz"))
    assert main(["serve", str(tmp_path), "--workers", "0"]) == 2
    error = capsys.readouterr().err
    assert "environment_tarball" in error and "--workers 1 or more" in error


def test_cors_keys_come_from_mlserver_variables_once_cors_settings_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MLSERVER_ALLOW_ORIGINS", '["https://a.example"]')
    monkeypatch.setenv("MLSERVER_MAX_AGE", "5")
    with caplog.at_level(logging.WARNING, "inferpool.settings"):
        assert load_server_settings(tmp_path, {}).cors_settings is None  # as MLServer
    assert "MLSERVER_ALLOW_ORIGINS has no effect: cors_settings is not set" in caplog.text
    (tmp_path / "settings.json").write_text(json.dumps({"cors_settings": {"max_age": 9}}))
    cors = load_server_settings(tmp_path, {}).cors_settings
    assert cors is not None
    assert cors.allow_origins == ["https://a.example"] and cors.max_age == 9  # the file's key


def test_cors_settings_flag_takes_json(tmp_path: Path) -> None:
    from inferpool.cli import build_parser

    args = build_parser().parse_args(
        ["serve", str(tmp_path), "--cors-settings", '{"allow_origins": ["*"]}']
    )
    settings = load_server_settings(tmp_path, {"cors_settings": args.cors_settings})
    assert settings.cors_settings is not None and settings.cors_settings.allow_origins == ["*"]


def test_mlserver_http_port_moves_the_server_and_inferpool_wins(iris_repo: Path) -> None:
    """A real server: MLSERVER_HTTP_PORT picks its port; INFERPOOL_HTTP_PORT beats it."""
    mlserver_port, inferpool_port = free_port(), free_port()
    base = {
        **os.environ,
        "MLSERVER_HOST": "127.0.0.1",
        "MLSERVER_GRPC_PORT": "0",
        "MLSERVER_METRICS_PORT": "0",
        "MLSERVER_PARALLEL_WORKERS": "0",
        "MLSERVER_HTTP_PORT": str(mlserver_port),
    }
    runs = [
        (base, mlserver_port),
        ({**base, "INFERPOOL_HTTP_PORT": str(inferpool_port)}, inferpool_port),
    ]
    for env, port in runs:
        command = [sys.executable, "-m", "inferpool", "serve", str(iris_repo)]
        process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
        try:
            _wait_ready(f"http://127.0.0.1:{port}", process)
            index = httpx.post(f"http://127.0.0.1:{port}/v2/repository/index").json()
            assert {m["name"] for m in index} == {"iris-logreg", "iris-rf"}
        finally:
            process.terminate()
            assert process.wait(60) == 0


def test_load_models_at_startup_false_serves_none_until_loaded(iris_repo: Path) -> None:
    """KServe's multi-model MLServer: ready with no model; the repository API loads one."""
    with Server(iris_repo, "--workers", "0", env={"MLSERVER_LOAD_MODELS_AT_STARTUP": "false"}) as s:
        s.wait_ready()
        assert all(m["state"] != "READY" for m in httpx.post(f"{s.url}/v2/repository/index").json())
        load = httpx.post(f"{s.url}/v2/repository/models/iris-rf/load", timeout=60)
        assert load.status_code == 200, load.text
        assert httpx.get(f"{s.url}/v2/models/iris-rf/ready").status_code == 200


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"server exited {process.returncode}"
        try:
            if httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(url)
