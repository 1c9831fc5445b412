"""The KServe peer's profile (kserve-wN), its command line, its virtualenv's pins, and which
scenarios each server and generator can measure (n/a with a reason, never a failure)."""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from benchmarks import kserve_env
from benchmarks.loadgen import perf_analyzer
from benchmarks.loadgen.base import Target
from benchmarks.runner import unsupported
from benchmarks.scenarios import Scenario
from benchmarks.servers import PEER, RunningServer, ServerSpec, command, server_folder

TARGET = Target("127.0.0.1", 1, 2)


def test_kserve_names_parse_with_one_worker_or_more_and_speak_every_protocol():
    spec = ServerSpec.parse("kserve-w2")
    assert (spec.kind, spec.workers) == ("kserve", 2)
    assert all(spec.supports(p) for p in ("rest-json", "rest-binary", "grpc-typed", "grpc-raw"))
    with pytest.raises(ValueError, match="1 or more"):
        ServerSpec.parse("kserve-w0")
    with pytest.raises(ValueError, match="unknown server"):
        ServerSpec.parse("kserve-w1-grpcio")


def test_kserve_command_runs_the_peer_with_kserves_own_options(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    spec = ServerSpec.parse("kserve-w2")
    cmd = command(spec, tmp_path, TARGET, None, "inferpool", python, ["iris", "lightgbm"])
    assert cmd == [
        str(python),
        str(PEER),
        "--model_dir",
        str(tmp_path),
        "--model",
        "iris",
        "--model",
        "lightgbm",
        "--http_port",
        "1",
        "--grpc_port",
        "2",
        "--workers",
        "2",
    ]
    assert PEER.is_file()
    with pytest.raises(ValueError, match="KServe is not installed"):
        command(spec, tmp_path, TARGET, None, "inferpool", None, ["iris"])
    with pytest.raises(ValueError, match="at least one model"):
        command(spec, tmp_path, TARGET, None, "inferpool", python, [])


def write_model(repo: Path, name: str = "iris") -> dict:
    (repo / name).mkdir(parents=True)
    (repo / name / "model.joblib").write_text("pickle")
    settings = {"name": name, "parameters": {"uri": "./model.joblib"}}
    (repo / name / "model-settings.json").write_text(json.dumps(settings))
    return settings


def test_a_perf_analyzer_run_gives_every_model_version_1_in_a_copy(tmp_path):
    repo = tmp_path / "repo"
    settings = write_model(repo)
    spec = ServerSpec.parse("kserve-w1")
    folder = server_folder(spec, repo, ["iris"], tmp_path / "work", TARGET, numbered=True)
    written = json.loads((folder / "iris" / "model-settings.json").read_text())
    assert written["parameters"] == {"uri": "./model.joblib", "version": "1"}
    assert (folder / "iris" / "model.joblib").read_text() == "pickle"
    assert json.loads((repo / "iris" / "model-settings.json").read_text()) == settings
    # With -library both edits land in the one copy.
    library = ServerSpec.parse("inferpool-w1-library")
    both = server_folder(library, repo, ["iris"], tmp_path / "lib", TARGET, numbered=True)
    parameters = json.loads((both / "iris" / "model-settings.json").read_text())["parameters"]
    assert parameters["version"] == "1" and parameters["extra"] == {"tree_kernel": False}


def test_kserves_virtualenv_pins_kserve_and_the_harness_model_libraries():
    import lightgbm
    import sklearn
    import xgboost

    pins = kserve_env.requirements()
    assert pins[0] == "kserve==0.21.0"
    assert f"scikit-learn=={sklearn.__version__}" in pins
    assert f"lightgbm=={lightgbm.__version__}" in pins
    assert any(p.startswith("xgboost") and p.endswith(f"=={xgboost.__version__}") for p in pins)


def fake_python(tmp_path: Path, output: str, status: int = 0) -> Path:
    """A 'python' that prints what the probe would read from a real one."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\necho '{output}'\nexit {status}\n")
    script.chmod(0o755)
    return script


def test_the_probe_names_every_version_that_differs(tmp_path):
    import lightgbm
    import sklearn
    import xgboost

    right = f"{sklearn.__version__} {lightgbm.__version__} {xgboost.__version__}"
    assert kserve_env.probe(fake_python(tmp_path, f"0.21.0 {right}")) is None
    old = kserve_env.probe(fake_python(tmp_path, f"0.15.2 {right}"))
    assert old == "kserve 0.15.2 (want 0.21.0)"
    # Another python (INFERPOOL_KSERVE_PYTHON) may hold any kserve, never other libraries.
    assert kserve_env.probe(fake_python(tmp_path, f"0.15.2 {right}"), pinned=False) is None
    wrong = kserve_env.probe(fake_python(tmp_path, f"0.21.0 1.0.0 {lightgbm.__version__} 9.9"))
    want = f"sklearn 1.0.0 (want {sklearn.__version__}), xgboost 9.9 (want {xgboost.__version__})"
    assert wrong == want
    assert "unexpected versions" in kserve_env.probe(fake_python(tmp_path, "0.21.0"))
    assert kserve_env.probe(tmp_path / "missing") == f"{tmp_path / 'missing'} does not exist"


def test_another_python_without_kserve_is_refused_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv(kserve_env.OVERRIDE, sys.executable)  # the harness's: no kserve here
    with pytest.raises(RuntimeError, match=r"cannot run the KServe peer: .*kserve"):
        kserve_env.ensure(tmp_path / "venv")
    assert not (tmp_path / "venv").exists()  # nothing installed


class ConfigServer:
    """Serves GET /v2/models/iris/config with a chosen status."""

    def __init__(self, status: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code = status if self.path == "/v2/models/iris/config" else 404
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.port = self.http.server_address[1]

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def running(name: str, http_port: int) -> RunningServer:
    return RunningServer(ServerSpec.parse(name), Target("127.0.0.1", http_port, 2))


@pytest.mark.parametrize("status", [200, 404])
def test_perf_analyzer_measures_binary_scenarios_on_servers_with_a_model_config(status):
    config = ConfigServer(status)
    try:
        server = running("kserve-w1", config.port)
        raw = Scenario("iris", 1, "grpc-raw", 8)
        json_body = Scenario("iris", 1, "rest-json", 8)
        assert unsupported(server, json_body, "wrk") == ""
        assert unsupported(server, raw, "h2load") == ""
        assert unsupported(server, json_body, "perf_analyzer") == perf_analyzer.PROTOCOL_REASON
        reason = unsupported(server, raw, "perf_analyzer")
        if status == 200:
            assert reason == ""
        else:
            assert reason == (
                "no model configuration (GET /v2/models/iris/config: HTTP 404), "
                "which perf_analyzer reads"
            )
    finally:
        config.close()


def test_a_server_lacking_a_protocol_says_so_before_the_generator_is_asked():
    server = running("mlserver-w0", 9)  # nothing listens: the protocol answers first
    reason = unsupported(server, Scenario("iris", 1, "rest-binary", 8), "perf_analyzer")
    assert reason == "mlserver-w0 lacks rest-binary"


def test_an_unreachable_server_is_left_to_the_check_to_fail_not_called_n_a():
    config = ConfigServer(200)
    port = config.port
    config.close()  # the port is free again: the GET is refused
    assert perf_analyzer.config_missing(f"http://127.0.0.1:{port}", "iris") == ""
