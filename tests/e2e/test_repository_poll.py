"""``--model-control-mode poll`` on real servers: the repository's folders decide.

A folder moved in is loaded, one copied in file by file loads once it is complete, a
changed model is reloaded (a broken change keeps the old version serving), a removed
folder is unloaded once its in-flight requests are answered; hidden and invalid folders
are ignored. The load/unload API works beside the watcher: an unload holds until the
folder changes. Each behaviour runs in-process and with a pool of two workers.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support import Server, iris_data, write_sklearn_model
from tests.support.pool import calls, write_counting_model
from tests.support.pool import wait_for as wait_until

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]
BODY = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": ROWS}]}
POLL = ("--model-control-mode", "poll", "--repository-debounce", "0.3")
SUM_BODY = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, 3]}]}


def logreg():
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(max_iter=1000).fit(*iris_data())


def constant(label: int):
    """A different estimator: predicts ``label`` for every row."""
    from sklearn.dummy import DummyClassifier

    return DummyClassifier(strategy="constant", constant=label).fit(*iris_data())


def joblib_bytes(estimator) -> bytes:
    import joblib

    buffer = io.BytesIO()
    joblib.dump(estimator, buffer)
    return buffer.getvalue()


def infer(server: Server, model: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=BODY, timeout=30)


def predict(server: Server, model: str) -> list:
    response = infer(server, model)
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]["data"]


def index(server: Server) -> dict[str, dict]:
    entries = httpx.post(f"{server.url}/v2/repository/index", timeout=30).json()
    return {entry["name"]: entry for entry in entries}


def wait_for(condition: Callable[[], object], server: Server, timeout: float = 30) -> None:
    """``tests.support.pool.wait_for``, failing with the index and the server's log."""
    try:
        wait_until(condition, timeout)
    except TimeoutError:
        raise AssertionError(
            f"not after {timeout}s; index {index(server)}\n{server.output()}"
        ) from None


def state(server: Server, name: str) -> str | None:
    entry = index(server).get(name)
    return entry and entry["state"]


def ready(server: Server) -> bool:
    return httpx.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", ["0", "2"])
def test_folders_moved_in_changed_and_removed(tmp_path: Path, workers: str) -> None:
    repository, staging = tmp_path / "models", tmp_path / "staging"
    write_sklearn_model(repository / "iris", logreg())
    with Server(repository, "--workers", workers, *POLL) as server:
        server.wait_ready()
        assert predict(server, "iris") == [0, 2]
        # A new folder, written elsewhere and moved in at once.
        write_sklearn_model(staging / "fixed", constant(1))
        os.rename(staging / "fixed", repository / "fixed")
        wait_for(lambda: state(server, "fixed") == "READY", server)
        assert predict(server, "fixed") == [1, 1]
        # A changed model: another estimator in its place; predictions follow.
        write_sklearn_model(repository / "iris", constant(2))
        wait_for(lambda: predict(server, "iris") == [2, 2], server)
        # A broken change: the previous version keeps serving and the server stays ready.
        (repository / "fixed" / "model.joblib").write_bytes(b"not a joblib file")
        wait_for(lambda: index(server)["fixed"]["reason"].startswith("reload failed"), server)
        assert index(server)["fixed"]["state"] == "READY"
        assert predict(server, "fixed") == [1, 1] and ready(server)
        # Repaired: served again.
        write_sklearn_model(repository / "fixed", constant(0))
        wait_for(lambda: predict(server, "fixed") == [0, 0], server)
        assert index(server)["fixed"]["reason"] == ""
        # A removed folder: unloaded, dropped from the index, then 404.
        shutil.rmtree(repository / "fixed")
        wait_for(lambda: "fixed" not in index(server), server)
        assert infer(server, "fixed").status_code == 404
        assert predict(server, "iris") == [2, 2] and ready(server)
        # Removed while a request runs: that request is answered first.
        write_counting_model(staging, "slow", tmp_path / "calls", delay=2)
        os.rename(staging / "slow", repository / "slow")
        wait_for(lambda: state(server, "slow") == "READY", server)
        with ThreadPoolExecutor(1) as pool:
            url = f"{server.url}/v2/models/slow/infer"
            running = pool.submit(httpx.post, url, json=SUM_BODY, timeout=60)
            wait_for(lambda: calls(tmp_path / "calls"), server)  # it is predicting
            shutil.rmtree(repository / "slow")
            answer = running.result()
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [6]
        wait_for(lambda: "slow" not in index(server), server)
        # The API works beside the watcher: an unload acts at once and holds until the
        # folder changes; a load acts at once.
        response = httpx.post(f"{server.url}/v2/repository/models/iris/unload", timeout=60)
        assert response.status_code == 200, response.text
        unloaded = {"name": "iris", "state": "UNAVAILABLE", "reason": ""}
        assert index(server)["iris"] == unloaded
        time.sleep(1.5)  # past the quiet period and an idle comparison of the folders
        assert index(server)["iris"]["state"] == "UNAVAILABLE"
        # Its only model unloaded, the server has none left to serve (strict readiness).
        not_ready = httpx.get(f"{server.url}/v2/health/ready", timeout=10)
        assert not_ready.status_code == 503 and "no model is loaded" in not_ready.text
        write_sklearn_model(repository / "iris", constant(1))
        wait_for(lambda: state(server, "iris") == "READY", server)
        assert predict(server, "iris") == [1, 1]
        response = httpx.post(f"{server.url}/v2/repository/models/iris/unload", timeout=60)
        assert response.status_code == 200 and state(server, "iris") == "UNAVAILABLE"
        response = httpx.post(f"{server.url}/v2/repository/models/iris/load", timeout=60)
        assert response.status_code == 200, response.text
        assert predict(server, "iris") == [1, 1] and ready(server)
        started = time.monotonic()
        assert server.stop() == 0
        assert time.monotonic() - started < 10  # the watch does not hold up shutdown
        assert "Traceback" not in server.output()


@pytest.mark.timeout(120)
# The pool's run waits in tox -e slow (the default run's budget); the debounce is the
# watcher's, the same for both.
@pytest.mark.parametrize("workers", ["0", pytest.param("2", marks=pytest.mark.slow)])
def test_a_slow_copy_loads_once_complete(tmp_path: Path, workers: str) -> None:
    repository = tmp_path / "models"
    write_sklearn_model(repository / "iris", logreg())
    settings = json.dumps({"name": "slow", "parameters": {"uri": "./model.joblib"}})
    artefact = joblib_bytes(constant(2))
    with Server(repository, "--workers", workers, *POLL) as server:
        server.wait_ready()
        # Written file by file with pauses shorter than the quiet period: one load, at the
        # end, never a failed one half-way.
        folder = repository / "slow"
        folder.mkdir()
        time.sleep(0.1)
        (folder / "model-settings.json").write_text(settings)
        time.sleep(0.1)
        with open(folder / "model.joblib", "wb") as file:
            for start in range(0, len(artefact), 200):
                file.write(artefact[start : start + 200])
                file.flush()
                time.sleep(0.05)
        seen = set()

        def loaded() -> bool:
            seen.add(state(server, "slow"))
            return "READY" in seen

        wait_for(loaded, server)
        assert seen <= {None, "LOADING", "READY"}
        assert predict(server, "slow") == [2, 2]
        assert "model 'slow' failed" not in server.output()

        # A pause longer than the quiet period: the settings alone fail (listed FAILED,
        # the server stays ready), then the artefact appears and the model loads.
        late = repository / "late"
        late.mkdir()
        (late / "model-settings.json").write_text(settings.replace("slow", "late"))
        wait_for(lambda: state(server, "late") == "FAILED", server)
        assert ready(server)
        (late / "model.joblib").write_bytes(artefact)
        wait_for(lambda: state(server, "late") == "READY", server)
        assert predict(server, "late") == [2, 2] and ready(server)


@pytest.mark.timeout(120)
def test_hidden_temporary_and_invalid_names_are_ignored(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    write_sklearn_model(repository / "iris", logreg())
    with Server(repository, "--workers", "0", *POLL) as server:
        server.wait_ready()
        write_sklearn_model(repository / ".staging", constant(1))
        write_sklearn_model(repository / "_drafts", constant(1))
        write_sklearn_model(repository / "a..b", constant(1))
        (repository / "iris" / ".model.joblib.swp").write_bytes(b"vim")
        (repository / "iris" / "model.joblib~").write_bytes(b"backup")
        (repository / "iris" / "__pycache__").mkdir()
        (repository / "iris" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"")
        # A marker model moved in last: once it is READY, the rest was seen and passed.
        write_sklearn_model(tmp_path / "marker", constant(0))
        os.rename(tmp_path / "marker", repository / "marker")
        wait_for(lambda: state(server, "marker") == "READY", server)
        time.sleep(1.5)  # past the quiet period and an idle comparison of the folders
        assert set(index(server)) == {"iris", "marker"}
        output = server.output()
        assert "folder 'iris' changed" not in output  # no reload for temporary files
        assert output.count("ignoring the folder 'a..b'") == 1
        assert predict(server, "iris") == [0, 2] and ready(server)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("implementation", ["builtin", "grpcio"])
def test_grpc_repository_api_works_in_poll_mode(tmp_path: Path, implementation: str) -> None:
    import grpc

    from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
    from tests.support.grpc import stub_for

    repository = tmp_path / "models"
    write_sklearn_model(repository / "iris", logreg())
    flags = ("--workers", "0", "--grpc-implementation", implementation, *POLL)
    with Server(repository, *flags) as server, stub_for(server) as stub:
        server.wait_ready()
        stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="iris"), timeout=30)
        answer = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30)
        assert [(m.name, m.state, m.reason) for m in answer.models] == [("iris", "UNAVAILABLE", "")]
        assert not stub.ModelReady(pb.ModelReadyRequest(name="iris"), timeout=30).ready
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="iris"), timeout=60)
        assert stub.ModelReady(pb.ModelReadyRequest(name="iris"), timeout=30).ready
        assert predict(server, "iris") == [0, 2]
        with pytest.raises(grpc.RpcError) as error:
            stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="nope"), timeout=30)
        assert error.value.code() is grpc.StatusCode.NOT_FOUND
