"""MLServer custom runtimes, unchanged (``from mlserver import MLModel``), served by inferpool
with MLServer 1.7.1 installed, and answering as MLServer itself answers them.

Run by tox's ``mlserver`` environment (marker ``mlserver``, tests/conftest.py).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from tests.mlserver.runtimes import (
    CASES,
    GREETER_REQUEST,
    grpc_outputs,
    grpc_request,
    write_repository,
)
from tests.support import Server
from tests.support.grpc import stub_for
from tests.support.mlserver import running_mlserver

IDS = [case[0] for case in CASES]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("mlserver-runtimes"), rewrite=False)


@pytest.fixture(scope="module", params=["1", "0"], ids=["workers", "in-process"])
def server(request: pytest.FixtureRequest, repository: Path) -> Iterator[Server]:
    with Server(repository, "--workers", request.param) as running:
        running.wait_ready(timeout=180)  # MLServer's imports in a worker, on a loaded machine
        yield running


@pytest.fixture(scope="module")
def mlserver(repository: Path) -> Iterator[str]:
    """MLServer 1.7.1 itself on the same repository: its REST address."""
    with running_mlserver(repository) as (url, _):
        yield url


def test_the_runtimes_subclass_mlservers_own_mlmodel(repository: Path) -> None:
    import mlserver

    from inferpool.mlserver.adapter.runtime import MLModelRuntime
    from inferpool.runtimes.registry import runtime_class
    from inferpool.settings import read_model_settings

    runtime = runtime_class(read_model_settings(repository / "scaler", "scaler"))
    assert issubclass(runtime, MLModelRuntime)
    assert issubclass(runtime.model_class, mlserver.MLModel)
    assert runtime.flavour.types.__name__ == "mlserver.types"


def test_an_inferpool_mlmodel_does_not_import_mlserver(tmp_path: Path) -> None:
    write_repository(tmp_path, rewrite=True)
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from inferpool.runtimes.registry import runtime_class\n"
        "from inferpool.settings import read_model_settings\n"
        "runtime = runtime_class(read_model_settings(Path(sys.argv[1]), 'scaler'))\n"
        "print(runtime.flavour.types.__name__, 'mlserver' in sys.modules)\n"
    )
    command = [sys.executable, "-c", code, str(tmp_path / "scaler")]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["inferpool.mlserver.types", "False"]


@pytest.mark.parametrize(("model", "body", "outputs"), CASES, ids=IDS)
def test_rest_answer_is_the_runtimes_response(server: Server, model, body, outputs) -> None:
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == outputs


@pytest.mark.parametrize(("model", "body", "outputs"), CASES, ids=IDS)
def test_grpc_answer_is_the_runtimes_response(server: Server, model, body, outputs) -> None:
    with stub_for(server) as stub:
        response = stub.ModelInfer(grpc_request(model, body), timeout=30)
    assert grpc_outputs(response) == outputs


@pytest.mark.parametrize(("model", "body", "outputs"), CASES, ids=IDS)
def test_mlserver_itself_gives_the_same_answer(
    server: Server, mlserver: str, model, body, outputs
) -> None:
    ours = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30).json()
    theirs = httpx.post(f"{mlserver}/v2/models/{model}/infer", json=body, timeout=30).json()
    assert ours["outputs"] == theirs["outputs"] == outputs
    assert ours.get("parameters", {}) == theirs.get("parameters", {})
    assert ours.get("model_version") == theirs.get("model_version")


def test_inference_error_answers_as_in_mlserver(server: Server, mlserver: str) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [-1]}]}
    ours = httpx.post(f"{server.url}/v2/models/scaler/infer", json=body)
    theirs = httpx.post(f"{mlserver}/v2/models/scaler/infer", json=body)
    assert ours.status_code == theirs.status_code == 400
    assert ours.json() == theirs.json() == {"error": "negative values cannot be scaled"}
    with stub_for(server) as stub, pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(grpc_request("scaler", body), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_an_unloaded_model_answers_404_as_in_mlserver(server: Server, mlserver: str) -> None:
    """MLServer drops an unloaded model from its registry: inference is 404 "Model greeter
    not found", and its index lists the folder UNAVAILABLE. inferpool answers 404 too
    (saying it was unloaded), never a 503 that clients would retry for ever."""
    urls = (server.url, mlserver)
    for url in urls:
        unloaded = httpx.post(f"{url}/v2/repository/models/greeter/unload", timeout=60)
        assert unloaded.status_code == 200, unloaded.text
    try:
        ours, theirs = (
            httpx.post(f"{url}/v2/models/greeter/infer", json=GREETER_REQUEST, timeout=30)
            for url in urls
        )
        assert ours.status_code == theirs.status_code == 404
        assert theirs.json() == {"error": "Model greeter not found"}
        assert ours.json() == {"error": "model 'greeter' was unloaded (load it again to serve it)"}
        for url in urls:
            index = httpx.post(f"{url}/v2/repository/index", json={}, timeout=30).json()
            (entry,) = [entry for entry in index if entry["name"] == "greeter"]
            assert entry["state"] == "UNAVAILABLE"
        with stub_for(server) as stub, pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(grpc_request("greeter", GREETER_REQUEST), timeout=30)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        for url in urls:
            httpx.post(f"{url}/v2/repository/models/greeter/load", timeout=60)
    for url in urls:
        answer = httpx.post(f"{url}/v2/models/greeter/infer", json=GREETER_REQUEST, timeout=30)
        assert answer.status_code == 200, answer.text
