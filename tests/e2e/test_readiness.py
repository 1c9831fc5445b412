"""Strict readiness: an orchestrator must never see a broken server as ready."""

from __future__ import annotations

import contextlib
import operator
import pickle
import time

import httpx

from tests.support import Server, build_iris_repository


class _Sleep:
    def __reduce__(self):
        return (time.sleep, (3,))


class _Explode:
    def __reduce__(self):
        return (operator.truediv, (1, 0))


def write_broken_model(folder):
    """A pickle that loads slowly and then fails (ZeroDivisionError), using only stdlib."""
    folder.mkdir(parents=True)
    (folder / "model.pkl").write_bytes(pickle.dumps([_Sleep(), _Explode()]))


def poll_ready_until_exit(server: Server, timeout: float = 60) -> list[int]:
    """Every status /v2/health/ready answered until the process ended."""
    statuses = []
    deadline = time.monotonic() + timeout
    while server.process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            statuses.append(httpx.get(server.url + "/v2/health/ready", timeout=2).status_code)
        time.sleep(0.05)
    return statuses


def test_failed_model_at_start_exits_non_zero_and_is_never_ready(tmp_path):
    build_iris_repository(tmp_path)
    write_broken_model(tmp_path / "broken")
    server = Server(tmp_path, "--workers", "0")
    server.wait_live()
    statuses = poll_ready_until_exit(server)
    code = server.wait_exit()
    assert code != 0
    assert statuses, "the server answered no readiness probe while loading"
    assert 200 not in statuses
    assert set(statuses) == {503}
    output = server.output()
    assert "broken" in output and "ZeroDivisionError" in output


def test_no_exit_on_error_stays_up_and_reports_the_failed_model(tmp_path):
    build_iris_repository(tmp_path)
    write_broken_model(tmp_path / "broken")
    with Server(tmp_path, "--workers", "0", "--no-exit-on-error") as server:
        server.wait_live()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            # Before the repository lists the model, metadata is a 404 with an error body.
            metadata = httpx.get(f"{server.url}/v2/models/broken").json()
            if metadata.get("state") == "FAILED":
                break
            time.sleep(0.1)
        assert metadata["state"] == "FAILED"
        assert "ZeroDivisionError" in metadata["reason"]
        # Once start-up has settled, readiness names the failed model (never 200 before).
        while time.monotonic() < deadline:
            ready = httpx.get(f"{server.url}/v2/health/ready")
            assert ready.status_code == 503
            if "starting up" not in ready.json()["error"]:
                break
            time.sleep(0.1)
        assert "broken" in ready.json()["error"]
        model_ready = httpx.get(f"{server.url}/v2/models/broken/ready")
        assert model_ready.status_code == 503
        assert "ZeroDivisionError" in model_ready.json()["error"]
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}
        infer = httpx.post(f"{server.url}/v2/models/broken/infer", json=body)
        assert infer.status_code == 503 and "ZeroDivisionError" in infer.json()["error"]
        # The healthy models still serve.
        assert httpx.get(f"{server.url}/v2/models/iris-rf/ready").status_code == 200
        good = httpx.post(f"{server.url}/v2/models/iris-rf/infer", json=body)
        assert good.status_code == 200
    assert server.returncode == 0


def test_empty_repository_is_not_ready_unless_allowed(tmp_path):
    with Server(tmp_path, "--workers", "0") as server:
        server.wait_live()
        time.sleep(0.5)
        response = httpx.get(f"{server.url}/v2/health/ready")
        assert response.status_code == 503
        assert "allow-empty" in response.json()["error"]
    with Server(tmp_path, "--workers", "0", "--allow-empty") as server:
        server.wait_ready()
        assert httpx.get(f"{server.url}/v2/health/ready").json() == {"ready": True}


def test_models_load_later_through_the_repository_api(tmp_path):
    with Server(tmp_path, "--workers", "0", "--allow-empty") as server:
        server.wait_ready()
        assert httpx.post(f"{server.url}/v2/repository/index").json() == []
        missing = httpx.post(f"{server.url}/v2/repository/models/iris-rf/load")
        assert missing.status_code == 404
        build_iris_repository(tmp_path)
        loaded = httpx.post(f"{server.url}/v2/repository/models/iris-rf/load", timeout=120)
        assert loaded.status_code == 200, loaded.text
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        assert index == [{"name": "iris-rf", "state": "READY", "reason": ""}]
        assert httpx.get(f"{server.url}/v2/models/iris-rf/ready").status_code == 200
        unloaded = httpx.post(f"{server.url}/v2/repository/models/iris-rf/unload", timeout=60)
        assert unloaded.status_code == 200
        # Still in the repository: listed as unloaded (Triton's index), not ready, and the
        # server stays ready.
        index = httpx.post(f"{server.url}/v2/repository/index").json()
        assert index == [{"name": "iris-rf", "state": "UNAVAILABLE", "reason": ""}]
        assert httpx.get(f"{server.url}/v2/models/iris-rf/ready").status_code == 503
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def test_sigterm_exits_zero(iris_repo):
    server = Server(iris_repo, "--workers", "0")
    server.wait_ready()
    assert server.stop() == 0
    assert "Traceback" not in server.output()
