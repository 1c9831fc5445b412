"""Server profiles and process-tree accounting."""

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from benchmarks.loadgen.base import Target
from benchmarks.ports import ServerPorts
from benchmarks.process_stats import cpu_between, tree_cpu, tree_rss
from benchmarks.servers import ServerSpec, command, server_folder, start


def test_server_names_parse_and_mlserver_lacks_binary_tensors():
    spec = ServerSpec.parse("mlserver-w2")
    assert (spec.kind, spec.workers) == ("mlserver", 2)
    assert not spec.supports("rest-binary") and spec.supports("grpc-raw")
    assert ServerSpec.parse("inferpool-w0").supports("rest-binary")
    with pytest.raises(ValueError, match="unknown server"):
        ServerSpec.parse("triton")


def test_a_grpcio_suffix_selects_inferpools_grpc_aio_implementation(tmp_path):
    spec = ServerSpec.parse("inferpool-w2-grpcio")
    assert (spec.kind, spec.workers, spec.grpc_implementation) == ("inferpool", 2, "grpcio")
    cmd = command(spec, tmp_path, Target("127.0.0.1", 1, 2), None, "inferpool")
    assert cmd[-2:] == ["--grpc-implementation", "grpcio"]
    assert "--grpc-implementation" not in command(
        ServerSpec.parse("inferpool-w2"), tmp_path, Target("127.0.0.1", 1, 2), None, "inferpool"
    )
    with pytest.raises(ValueError, match="unknown server"):
        ServerSpec.parse("mlserver-w2-grpcio")


def test_inferpool_command_runs_the_module_with_its_ports(tmp_path):
    cmd = command(
        ServerSpec.parse("inferpool-w1"), tmp_path, Target("127.0.0.1", 1, 2), None, "inferpool"
    )
    assert cmd == [
        sys.executable,
        "-m",
        "inferpool",
        "serve",
        str(tmp_path),
        "--host",
        "127.0.0.1",
        "--http-port",
        "1",
        "--grpc-port",
        "2",
        "--workers",
        "1",
    ]


def test_tree_accounting_includes_children():
    # A parent that starts a child which burns CPU: both must be counted.
    code = (
        "import subprocess, sys, time;"
        "subprocess.Popen([sys.executable, '-c', 'x = bytearray(64 << 20)\\n"
        "while True: pass']); time.sleep(30)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while tree_rss(parent.pid) < 64 << 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tree_rss(parent.pid) > 64 << 20
        before = tree_cpu(parent.pid)
        assert len(before) == 2
        # On a loaded machine the child may get little CPU: wait for it rather than 0.5 s.
        deadline = time.monotonic() + 20
        while cpu_between(before, tree_cpu(parent.pid)) <= 0.1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cpu_between(before, tree_cpu(parent.pid)) > 0.1
    finally:
        for child in psutil.Process(parent.pid).children():
            child.kill()
        parent.kill()
        parent.wait()


def test_a_library_suffix_turns_the_tree_kernel_off_in_the_servers_model_settings(tmp_path):
    spec = ServerSpec.parse("inferpool-w2-grpcio-library")
    assert (spec.grpc_implementation, spec.tree_kernel) == ("grpcio", False)
    assert ServerSpec.parse("inferpool-w2").tree_kernel
    with pytest.raises(ValueError, match="unknown server"):
        ServerSpec.parse("mlserver-w2-library")
    repo = tmp_path / "repo"
    (repo / "lightgbm").mkdir(parents=True)
    (repo / "lightgbm" / "model.txt").write_text("tree")
    settings = {"name": "lightgbm", "parameters": {"uri": "./model.txt"}}
    (repo / "lightgbm" / "model-settings.json").write_text(json.dumps(settings))
    target = Target("127.0.0.1", 1, 2)
    folder = server_folder(spec, repo, ["lightgbm"], tmp_path / "work", target)
    written = json.loads((folder / "lightgbm" / "model-settings.json").read_text())
    assert written["parameters"] == {"uri": "./model.txt", "extra": {"tree_kernel": False}}
    assert (folder / "lightgbm" / "model.txt").read_text() == "tree"
    # The shared repository is untouched; a kernel profile links the model folder as it is.
    assert json.loads((repo / "lightgbm" / "model-settings.json").read_text()) == settings
    kernel = ServerSpec.parse("inferpool-w2")
    plain = server_folder(kernel, repo, ["lightgbm"], tmp_path / "w2", target)
    assert (plain / "lightgbm").resolve() == (repo / "lightgbm").resolve()


def test_a_base_suffix_runs_inferpool_from_the_base_checkout(tmp_path):
    spec = ServerSpec.parse("inferpool-w2-grpcio-base")
    assert (spec.base, spec.grpc_implementation) == (True, "grpcio")
    assert not ServerSpec.parse("inferpool-w2").base
    with pytest.raises(ValueError, match="unknown server"):
        ServerSpec.parse("mlserver-w2-base")
    repo = tmp_path / "repo"
    (repo / "iris").mkdir(parents=True)
    with pytest.raises(ValueError, match="needs --base-checkout"):
        start(spec, repo, ["iris"], tmp_path / "work")
    with pytest.raises(ValueError, match="holds no inferpool"):
        start(spec, repo, ["iris"], tmp_path / "work", base_checkout=tmp_path)
    # A stand-in checkout whose `python -m inferpool` records where it was imported from.
    package = tmp_path / "base" / "inferpool"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    marker = tmp_path / "ran-from"
    (package / "__main__.py").write_text(
        f"import inferpool, pathlib; pathlib.Path({str(marker)!r}).write_text(inferpool.__file__)"
    )
    with pytest.raises(RuntimeError, match="exited 0"):
        start(spec, repo, ["iris"], tmp_path / "work", base_checkout=tmp_path / "base")
    assert marker.read_text() == str(package / "__init__.py")


def test_a_server_listens_on_the_ports_it_is_given(tmp_path, monkeypatch):
    """--port-base's plan reaches the server: REST and gRPC on its command line, metrics
    in INFERPOOL_METRICS_PORT (inferpool) or settings.json (MLServer)."""
    (tmp_path / "standin_server.py").write_text(
        "import json, os, pathlib, sys\n"
        "pathlib.Path(sys.argv[0]).with_name('seen.json').write_text(json.dumps("
        "[sys.argv[1:], os.environ['INFERPOOL_METRICS_PORT']]))\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    repo = tmp_path / "repo"
    (repo / "iris").mkdir(parents=True)
    ports = ServerPorts(http=21001, grpc=21002, metrics=21003)
    spec = ServerSpec.parse("inferpool-w0")
    with pytest.raises(RuntimeError, match="exited 0"):
        start(
            spec, repo, ["iris"], tmp_path / "work", inferpool_module="standin_server", ports=ports
        )
    argv, metrics = json.loads((tmp_path / "seen.json").read_text())
    assert argv[argv.index("--http-port") + 1] == "21001"
    assert argv[argv.index("--grpc-port") + 1] == "21002"
    assert metrics == "21003"
    mlserver = ServerSpec.parse("mlserver-w0")
    target = Target("127.0.0.1", ports.http, ports.grpc)
    folder = server_folder(mlserver, repo, ["iris"], tmp_path / "ml", target, metrics_port=21003)
    settings = json.loads((folder / "settings.json").read_text())
    assert (settings["http_port"], settings["grpc_port"], settings["metrics_port"]) == (
        21001,
        21002,
        21003,
    )
