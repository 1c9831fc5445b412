"""The native peers (BentoML, LitServe, Ray Serve) in the harness, without their frameworks:
names and protocols, the native request body built from a scenario's V2 payload, the answer
check, the peer's folder and command line, its virtualenv's pins, and ``zoo.py`` (what every
peer's service predicts with) against the harness's own expected predictions.

Starting the peers for real needs their virtualenvs (minutes of pip installs): that is
``python -m benchmarks run --servers bentoml,litserve,rayserve ...``, not this file.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from benchmarks import native_env, native_peers, runner
from benchmarks.check import CheckFailed, check
from benchmarks.loadgen.base import Target
from benchmarks.models import build_repository, features, load_predictor
from benchmarks.payloads import batch_rows, build_payload
from benchmarks.servers import RunningServer, ServerSpec, command, server_folder

NUMBER = re.compile(rb"-?\d[\d.eE+-]*")
TARGET = Target("127.0.0.1", 21000, None)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("repo"), ["iris", "lightgbm"])


def payload(repo: Path, model: str, batch: int, protocol: str):
    x = batch_rows(features(model), batch)
    return build_payload(model, batch, protocol, x, load_predictor(repo, model)(x))


def test_peer_names_give_a_worker_per_core_and_json_scenarios_only(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    for kind in ("bentoml", "litserve", "rayserve"):
        spec = ServerSpec.parse(kind)
        assert (spec.name, spec.kind, spec.workers) == (kind, kind, 6)
        assert spec.supports("rest-json") and spec.supports("rest-json17")
        assert not any(spec.supports(p) for p in ("rest-binary", "grpc-typed", "grpc-raw"))
    assert ServerSpec.parse("litserve-w3").workers == 3
    with pytest.raises(ValueError, match="1 worker or more"):
        ServerSpec.parse("rayserve-w0")
    with pytest.raises(ValueError, match="bentoml, litserve or rayserve"):
        ServerSpec.parse("bentoml-x")


@pytest.mark.parametrize("protocol", ["rest-json", "rest-json17"])
def test_the_native_body_carries_the_v2_bodys_very_number_tokens(repo, protocol):
    v2 = payload(repo, "lightgbm", 256, protocol)
    native = native_peers.adapt("litserve", v2)
    assert (native.path, native.headers) == ("/predict", {"Content-Type": "application/json"})
    document = json.loads(native.body)
    assert document["model"] == "lightgbm"
    assert np.array_equal(np.float32(document["input"]), batch_rows(features("lightgbm"), 256))
    v2_data = v2.body[v2.body.index(b'"data":') :]
    native_data = native.body[native.body.index(b'"input":') :]
    assert NUMBER.findall(native_data) == NUMBER.findall(v2_data)  # same text, same batch
    assert native.expected is v2.expected
    assert native_peers.adapt("inferpool", v2) is v2
    with pytest.raises(ValueError, match="JSON only"):
        native_peers.adapt("bentoml", payload(repo, "iris", 1, "grpc-raw"))


def test_answers_are_read_as_bentomls_list_or_an_output_field():
    assert native_peers.decode_answer({}, b"[0, 2, 1]").tolist() == [0, 2, 1]
    assert native_peers.decode_answer({}, b'{"output": [0.25, 0.5]}').tolist() == [0.25, 0.5]
    with pytest.raises(ValueError, match="not a list"):
        native_peers.decode_answer({}, b'{"output": 3}')
    with pytest.raises(KeyError):
        native_peers.decode_answer({}, b'{"error": "boom"}')


def test_the_peers_folder_holds_its_service_zoo_and_peer_json(repo, tmp_path):
    spec = ServerSpec.parse("rayserve-w2")
    folder = server_folder(spec, repo, ["iris", "lightgbm"], tmp_path, TARGET)
    assert folder == tmp_path / "rayserve-w2"
    assert (folder / "rayserve_app.py").read_text() == (
        native_peers.PEERS_DIR / "rayserve_app.py"
    ).read_text()
    assert (folder / "zoo.py").is_file()
    config = json.loads((folder / "peer.json").read_text())
    assert config == {
        "host": "127.0.0.1",
        "port": 21000,
        "workers": 2,
        "models": {
            "iris": {"library": "sklearn", "path": str((repo / "iris/model.joblib").resolve())},
            "lightgbm": {
                "library": "lightgbm",
                "path": str((repo / "lightgbm/model.txt").resolve()),
            },
        },
    }
    onnx = tmp_path / "repo" / "onnx"
    onnx.mkdir(parents=True)
    settings = {"implementation": "onnx", "parameters": {"uri": "./model.onnx"}}
    (onnx / "model-settings.json").write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="cannot serve 'onnx'"):
        native_peers.model_entry(tmp_path / "repo", "onnx")


def test_each_peer_is_run_by_its_own_virtualenv(tmp_path):
    bentoml = command(ServerSpec.parse("bentoml"), tmp_path, TARGET, None, "inferpool")
    venv = native_env.venv("bentoml") / "bin"
    assert bentoml == [
        str(venv / "bentoml"), "serve", "bentoml_service:Classifier", "--host", "127.0.0.1",
        "--port", "21000", "--working-dir", str(tmp_path),
    ]  # fmt: skip
    litserve = command(ServerSpec.parse("litserve"), tmp_path, TARGET, None, "inferpool")
    python = native_env.venv("litserve") / "bin" / "python"
    assert litserve == [str(python), str(tmp_path / "litserve_server.py")]
    env = native_peers.environment("bentoml", tmp_path, tmp_path / "home")
    assert env["PYTHONPATH"] == str(tmp_path) and env["BENTOML_HOME"] == str(tmp_path / "home")
    assert "BENTOML_HOME" not in native_peers.environment("rayserve", tmp_path, tmp_path)


def fake_python(tmp_path: Path, lines: list[str]) -> Path:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines))
    script.chmod(0o755)
    return script


def test_the_virtualenvs_pin_the_framework_and_the_harness_libraries(tmp_path):
    import lightgbm
    import sklearn
    import xgboost

    pins = native_env.requirements("rayserve")
    assert pins[:3] == ["ray[serve]==2.60.0", f"scikit-learn=={sklearn.__version__}",
                        f"lightgbm=={lightgbm.__version__}"]  # fmt: skip
    assert pins[3].startswith("xgboost") and pins[3].endswith(f"=={xgboost.__version__}")
    libraries = [line.split("==") for line in pins[1:]]
    right = [f"{name} {version}" for name, version in libraries]
    assert native_env.probe("rayserve", fake_python(tmp_path, ["ray 2.60.0", *right])) is None
    old = native_env.probe("rayserve", fake_python(tmp_path, ["ray 2.9.0", *right]))
    assert old == "ray 2.9.0 (want 2.60.0)"
    missing = native_env.probe("bentoml", fake_python(tmp_path, right))
    assert missing == "bentoml None (want 1.4.40)"
    assert native_env.probe("litserve", tmp_path / "nope") == f"{tmp_path / 'nope'} does not exist"


def test_an_install_failure_says_pips_reason(tmp_path):
    log = tmp_path / "install.log"
    log.write_text(
        "WARNING: Location 'file:///opt/x' is ignored\n"
        "ERROR: Could not find a version that satisfies the requirement ray==2.60.0\n"
        "ERROR: No matching distribution found for ray==2.60.0\n\n"
    )
    assert native_env.pip_error(log) == "ERROR: No matching distribution found for ray==2.60.0"
    log.write_text("Killed\n")
    assert native_env.pip_error(log) == "Killed"


def test_a_peer_that_cannot_be_installed_fails_its_cells_with_the_reason(monkeypatch):
    def ensure(kind: str) -> Path:
        if kind == "rayserve":
            raise RuntimeError("rayserve install did not work (pip exited 1)")
        return Path("/venv/bin/python")

    monkeypatch.setattr(native_env, "ensure", ensure)
    specs = [ServerSpec.parse(n) for n in ("inferpool-w2", "bentoml", "rayserve", "rayserve-w1")]
    why = runner.native_installs(specs, lambda text: None)
    assert why == {"rayserve": "install: rayserve install did not work (pip exited 1)"}


def load_zoo(folder: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("peer_zoo", folder / "zoo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def zoo_peer(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A stand-in peer: ``zoo.py`` loaded from a peer folder, answering ``/predict`` the way
    the LitServe and Ray Serve services do (``{"output": zoo.answer(...)}``)."""
    folder = server_folder(
        ServerSpec.parse("litserve"), repo, ["iris", "lightgbm"],
        tmp_path_factory.mktemp("work"), TARGET,
    )  # fmt: skip
    zoo = load_zoo(folder)
    models = zoo.load(folder)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body = json.dumps({"output": zoo.answer(models, request)}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    target = Target("127.0.0.1", http.server_address[1], None)
    yield RunningServer(ServerSpec.parse("litserve"), target)
    http.shutdown()
    http.server_close()
    sys.modules.pop("peer_zoo", None)


@pytest.mark.parametrize(
    ("model", "batch", "protocol"),
    [
        ("iris", 1, "rest-json"),
        ("iris", 256, "rest-json17"),
        ("lightgbm", 256, "rest-json"),
    ],
)
def test_zoo_predicts_what_the_libraries_predict_and_the_check_reads_it(
    repo, zoo_peer, model, batch, protocol
):
    native = native_peers.adapt("litserve", payload(repo, model, batch, protocol))
    assert check(zoo_peer, native) > 0  # CheckFailed unless the predictions are right


def test_the_check_refuses_a_peers_wrong_answer(repo, zoo_peer):
    right = native_peers.adapt("litserve", payload(repo, "iris", 256, "rest-json"))
    wrong = type(right)(**{**right.__dict__, "expected": (right.expected + 1) % 3})
    with pytest.raises(CheckFailed, match="wrong predictions"):
        check(zoo_peer, wrong)


def test_the_full_profile_runs_the_peers_and_the_quick_one_does_not():
    from benchmarks.scenarios import PROFILES

    full = PROFILES["full"].servers
    assert {"kserve-w1", "bentoml", "litserve", "rayserve", "mlserver-w0"} <= set(full)
    assert PROFILES["quick"].servers == ("mlserver-w0", "inferpool-w2")
