"""The model repository API is not an open door (issue 12, point 5), on real servers.

The admin token and ``--model-control-mode none`` on REST and on both gRPC
implementations; names confined to the repository; a failed load that reports to its
caller and leaves the server ready; a failed reload that keeps the previous version
serving; a FAILED model that can always be unloaded; and model folders whose files cannot
replace a standard-library module or another model's module.
"""

from __future__ import annotations

import json
import operator
import pickle
import shutil
import time
from pathlib import Path

import grpc
import httpx
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server
from tests.support.grpc import stub_for

TOKEN = "t0ken-0f-the-admin"
ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]
BODY = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": ROWS}]}


class _Explode:
    def __reduce__(self):
        return (operator.truediv, (1, 0))


def copy_iris(iris_repo: Path, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in ("iris-logreg", "iris-rf"):
        shutil.copytree(iris_repo / name, root / name)
    return root


def write_exploding_model(folder: Path) -> None:
    """A model whose load raises ZeroDivisionError (a pickle of stdlib calls only)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.pkl").write_bytes(pickle.dumps(_Explode()))


def predict(server: Server, model: str = "iris-logreg") -> list:
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", json=BODY, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


def index(server: Server) -> dict[str, dict]:
    entries = httpx.post(f"{server.url}/v2/repository/index", timeout=30).json()
    return {entry["name"]: entry for entry in entries}


def ready(server: Server) -> int:
    return httpx.get(f"{server.url}/v2/health/ready", timeout=30).status_code


def rest(server: Server, action: str, name: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    url = f"{server.url}/v2/repository/models/{name}/{action}"
    return httpx.post(url, headers=headers, timeout=120)


def grpc_call(server: Server, action: str, name: str, token: str | None = None):
    """A repository RPC: None when it succeeded, else its grpc.RpcError."""
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
    with stub_for(server) as stub:
        try:
            if action == "load":
                request = pb.RepositoryModelLoadRequest(model_name=name)
                stub.RepositoryModelLoad(request, metadata=metadata, timeout=120)
            else:
                request = pb.RepositoryModelUnloadRequest(model_name=name)
                stub.RepositoryModelUnload(request, metadata=metadata, timeout=120)
        except grpc.RpcError as error:
            return error
    return None


# -- the admin token -------------------------------------------------------------------
@pytest.mark.parametrize("workers, implementation", [(0, "builtin"), (2, "grpcio"), (2, "builtin")])
def test_admin_token_guards_load_and_unload(tmp_path, iris_repo, workers, implementation):
    repository = copy_iris(iris_repo, tmp_path / "models")
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN}\n")
    flags = ("--workers", str(workers), "--grpc-implementation", implementation)
    with Server(repository, *flags, "--admin-token-file", str(token_file)) as server:
        server.wait_ready()
        expected = predict(server)
        for token in (None, "wrong", TOKEN[:-1], TOKEN + "x", "Bearer"):
            for action in ("unload", "load"):
                response = rest(server, action, "iris-logreg", token)
                assert response.status_code == 401, response.text
                assert "admin token" in response.json()["error"]
                error = grpc_call(server, action, "iris-logreg", token)
                assert error is not None and error.code() is grpc.StatusCode.UNAUTHENTICATED
        # Basic or a bare token is no bearer token either.
        bare = httpx.post(
            f"{server.url}/v2/repository/models/iris-logreg/unload",
            headers={"Authorization": TOKEN},
        )
        assert bare.status_code == 401
        # Nothing was unloaded; the index stays open (read-only, as Triton's).
        assert predict(server) == expected
        assert index(server)["iris-logreg"]["state"] == "READY"
        with stub_for(server) as stub:
            names = [m.name for m in stub.RepositoryIndex(pb.RepositoryIndexRequest()).models]
        assert sorted(names) == ["iris-logreg", "iris-rf"]
        # With the token, both protocols load and unload.
        assert rest(server, "unload", "iris-logreg", TOKEN).status_code == 200
        assert index(server)["iris-logreg"]["state"] == "UNAVAILABLE"  # unloaded, still listed
        assert rest(server, "load", "iris-logreg", TOKEN).status_code == 200
        assert predict(server) == expected
        assert grpc_call(server, "unload", "iris-rf", TOKEN) is None
        assert index(server)["iris-rf"]["state"] == "UNAVAILABLE"  # unloaded, still listed
        assert grpc_call(server, "load", "iris-rf", TOKEN) is None
        assert index(server)["iris-rf"]["state"] == "READY"
        assert ready(server) == 200
        server.stop()
        assert TOKEN not in server.output()


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--admin-token", "a", "--admin-token-file", "{file}"), "not both"),
        (("--admin-token-file", "{empty}"), "is empty"),
        (("--admin-token-file", "{missing}"), "cannot read the admin token file"),
    ],
)
def test_an_unusable_admin_token_stops_the_start_up(tmp_path, flags, message):
    paths = {"file": tmp_path / "token", "empty": tmp_path / "empty", "missing": tmp_path / "no"}
    paths["file"].write_text(TOKEN)
    paths["empty"].write_text(" \n")
    flags = tuple(flag.format(**paths) for flag in flags)
    server = Server(tmp_path, "--workers", "0", "--allow-empty", *flags)
    try:
        assert server.wait_exit(60) != 0
        output = server.output()
        assert message in output
        assert TOKEN not in output and "Traceback" not in output
    finally:
        server.stop()
        server.log.close()


# -- --model-control-mode none ----------------------------------------------------------
@pytest.mark.parametrize("implementation", ["builtin", "grpcio"])
def test_control_mode_none_disables_load_and_unload(tmp_path, iris_repo, implementation):
    repository = copy_iris(iris_repo, tmp_path / "models")
    flags = ("--workers", "0", "--grpc-implementation", implementation)
    with Server(repository, *flags, "--model-control-mode", "none") as server:
        server.wait_ready()
        for action in ("unload", "load"):
            response = rest(server, action, "iris-rf")
            assert response.status_code == 403
            assert response.json() == {
                "error": "the model repository API is disabled (--model-control-mode none)"
            }
            error = grpc_call(server, action, "iris-rf")
            assert error is not None and error.code() is grpc.StatusCode.PERMISSION_DENIED
            assert "model-control-mode none" in error.details()
        assert index(server)["iris-rf"]["state"] == "READY"
        predict(server, "iris-rf")
        assert ready(server) == 200


# -- names, failed loads, failed reloads, unloading FAILED models -------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_failed_loads_and_reloads_leave_the_server_ready(tmp_path, iris_repo, workers):
    repository = copy_iris(iris_repo, tmp_path / "models")
    # A folder outside the repository, reachable through a symlink: loading it would run
    # its module, which would leave a mark.
    outside = tmp_path / "outside" / "evil"
    outside.mkdir(parents=True)
    mark = tmp_path / "outside-was-read"
    (outside / "evil_runtime.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    settings = {"name": "escape", "implementation": "evil_runtime.Evil"}
    (outside / "model-settings.json").write_text(json.dumps(settings))
    with Server(repository, "--workers", str(workers)) as server:
        server.wait_ready()
        expected = predict(server)
        (repository / "escape").symlink_to(outside, target_is_directory=True)

        # Names: refused before anything is read.
        response = rest(server, "load", "escape")
        assert response.status_code == 400
        assert "outside the model repository" in response.json()["error"]
        assert rest(server, "load", "a..b").status_code == 400
        for name in ("../outside/evil", "..", "x/../../outside", "nul\x00", "back\\slash"):
            error = grpc_call(server, "load", name)
            assert error is not None and error.code() is grpc.StatusCode.INVALID_ARGUMENT, name
            assert "invalid model name" in error.details()
        for name in ("../outside/evil", "escape", "no-such-model"):
            error = grpc_call(server, "unload", name)
            assert error is not None and error.code() is grpc.StatusCode.NOT_FOUND
        assert not mark.exists()
        assert ready(server) == 200

        # A new model whose load raises: the caller gets the reason; the server stays ready.
        write_exploding_model(repository / "broken")
        response = rest(server, "load", "broken")
        assert response.status_code == 500
        assert "ZeroDivisionError" in response.json()["error"]
        assert index(server)["broken"]["state"] == "FAILED"
        assert "ZeroDivisionError" in index(server)["broken"]["reason"]
        assert ready(server) == 200
        assert predict(server) == expected
        error = grpc_call(server, "load", "broken")
        assert error is not None and error.code() is grpc.StatusCode.INTERNAL
        assert ready(server) == 200

        # Bad settings are the caller's 400.
        (repository / "bad-settings").mkdir()
        (repository / "bad-settings" / "model-settings.json").write_text("{not json")
        response = rest(server, "load", "bad-settings")
        assert response.status_code == 400 and "not valid JSON" in response.json()["error"]
        assert ready(server) == 200

        # A reload that fails keeps the previous version serving.
        (repository / "iris-logreg" / "model.joblib").write_bytes(b"not a model")
        response = rest(server, "load", "iris-logreg")
        assert response.status_code == 500, response.text
        assert "failed to load" in response.json()["error"]
        entry = index(server)["iris-logreg"]
        assert entry["state"] == "READY" and entry["reason"].startswith("reload failed: ")
        metadata = httpx.get(f"{server.url}/v2/models/iris-logreg").json()
        assert metadata["state"] == "READY" and metadata["reason"].startswith("reload failed")
        with stub_for(server) as stub:
            models = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True)).models
            (logreg,) = [m for m in models if m.name == "iris-logreg"]
            assert logreg.reason.startswith("reload failed")
            assert stub.ServerReady(pb.ServerReadyRequest()).ready
        for _ in range(4 * max(workers, 1)):  # every replica still answers
            assert predict(server) == expected
        assert ready(server) == 200

        # FAILED models unload; the server is ready throughout.
        assert rest(server, "unload", "broken").status_code == 200
        assert grpc_call(server, "unload", "bad-settings") is None
        unloaded = {
            name
            for name, entry in index(server).items()
            if entry["state"] == "UNAVAILABLE" and entry["reason"] == ""  # as MLServer lists them
        }
        assert unloaded == {"broken", "bad-settings"}  # still in the repository: listed
        assert ready(server) == 200
        assert predict(server, "iris-rf")
    assert server.returncode == 0


def test_a_start_up_failure_with_an_odd_name_can_be_unloaded(tmp_path, iris_repo):
    repository = copy_iris(iris_repo, tmp_path / "models")
    odd = repository / "odd"
    write_exploding_model(odd)
    (odd / "model-settings.json").write_text(json.dumps({"name": "../odd"}))
    with Server(repository, "--workers", "0", "--no-exit-on-error") as server:
        server.wait_live()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "odd" not in index(server):
            time.sleep(0.1)
        entry = index(server)["odd"]
        assert entry["state"] == "FAILED" and "'..'" in entry["reason"]
        while time.monotonic() < deadline:
            response = httpx.get(f"{server.url}/v2/health/ready")
            if "starting up" not in response.text:
                break
            time.sleep(0.1)
        assert response.status_code == 503 and "odd" in response.json()["error"]
        assert rest(server, "unload", "odd").status_code == 200
        assert ready(server) == 200


# -- model folders and sys.path ---------------------------------------------------------
RUNTIME = """
import numpy as np

from inferpool import Runtime, TensorSpec

import helper_{tag}


class Model(Runtime):
    def load(self):
        import colorsys
        import random

        self.value = helper_{tag}.VALUE
        self.check = (random.random(), colorsys.rgb_to_hsv(0.2, 0.4, 0.4))

    def outputs(self):
        return [TensorSpec("value", "INT64", [-1])]

    def predict(self, payload, outputs):
        import json
        import random

        random.random()
        json.dumps({{}})
        return {{"value": np.full(len(payload), self.value, dtype=np.int64)}}
"""

SHADOW = "raise ImportError('a model folder shadowed the standard library: {name}')\n"


def write_module_model(root: Path, folder: str, tag: str, value: int, shadows: bool) -> None:
    path = root / folder
    path.mkdir(parents=True)
    # Both folders name their module model.py: each must still get its own.
    (path / "model.py").write_text(RUNTIME.format(tag=tag))
    (path / f"helper_{tag}.py").write_text(f"VALUE = {value}\n")
    if shadows:
        for name in ("json", "random", "colorsys", "numpy", "inferpool"):
            (path / f"{name}.py").write_text(SHADOW.format(name=name))
    settings = {"name": folder, "implementation": "model.Model"}
    (path / "model-settings.json").write_text(json.dumps(settings))


@pytest.mark.parametrize("workers", [0, 2])
def test_model_folders_cannot_replace_modules(tmp_path, workers):
    repository = tmp_path / "models"
    write_module_model(repository, "a-shadows", "a", 11, shadows=True)
    write_module_model(repository, "b-victim", "b", 22, shadows=False)
    body = {"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}
    with Server(repository, "--workers", str(workers)) as server:
        server.wait_ready()
        for _ in range(4):
            for model, value in (("a-shadows", 11), ("b-victim", 22)):
                url = f"{server.url}/v2/models/{model}/infer"
                response = httpx.post(url, json=body, timeout=30)
                assert response.status_code == 200, response.text
                assert response.json()["outputs"][0]["data"] == [value] * 3
        # A reload runs the folder's current file, and the other model is unaffected.
        (repository / "b-victim" / "helper_b.py").write_text("VALUE = 23\n")
        (repository / "b-victim" / "model.py").write_text(
            RUNTIME.format(tag="b").replace("self.value = helper_b.VALUE", "self.value = 33")
        )
        assert rest(server, "load", "b-victim").status_code == 200
        response = httpx.post(f"{server.url}/v2/models/b-victim/infer", json=body, timeout=30)
        assert response.json()["outputs"][0]["data"] == [33] * 3
        response = httpx.post(f"{server.url}/v2/models/a-shadows/infer", json=body, timeout=30)
        assert response.json()["outputs"][0]["data"] == [11] * 3
        server.stop()
        assert "shadowed the standard library" not in server.output()
