"""What the probes say (issue 14, point 4), and the drain's edges.

Liveness fails only when the process is wedged: never because a model failed or because
the server drains. Readiness turns 503 the moment a drain starts, while the server keeps
serving; a second signal ends the drain delay. A signal during start-up waits for no
delay. The workers and the template exit when the frontend is killed. Uvicorn's lines are
not logged twice (issue 14, point 7).
"""

from __future__ import annotations

import collections
import contextlib
import operator
import os
import pickle
import re
import signal
import threading
import time
from pathlib import Path

import grpc
import httpx
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, build_iris_repository
from tests.support.grpc import IMPLEMENTATIONS
from tests.support.runtimes import write_echo_model

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
IRIS_BODY = {
    "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [[5.1, 3.5, 1.4, 0.2]]}]
}


class _Explode:
    """Unpickled as 1 / 0: a model whose load fails."""

    def __reduce__(self):
        return (operator.truediv, (1, 0))


class _Sleep:
    """Unpickled as time.sleep(20): a model whose load takes long (then fails)."""

    def __reduce__(self):
        return (time.sleep, (20,))


def wait_for_status(url: str, status: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (answer := httpx.get(url, timeout=10).status_code) != status:
        assert time.monotonic() < deadline, f"{url} answers {answer}, not {status}"
        time.sleep(0.02)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_drain_keeps_live_and_serving_turns_not_ready_and_a_second_signal_ends_it(
    iris_repo: Path, implementation: str
) -> None:
    args = ("--workers", "2", "--drain-delay", "60", "--grpc-implementation", implementation)
    with Server(iris_repo, *args) as server:
        server.wait_ready()
        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = GRPCInferenceServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            assert stub.ServerReady(pb.ServerReadyRequest()).ready
            server.process.send_signal(signal.SIGTERM)
            wait_for_status(f"{server.url}/v2/health/ready", 503, timeout=5)
            ready = httpx.get(f"{server.url}/v2/health/ready")
            assert ready.json() == {"ready": False, "error": "server is shutting down"}
            assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
            # The models stay ready (they serve): only the server leaves the endpoints.
            assert httpx.get(f"{server.url}/v2/models/iris-rf/ready").status_code == 200
            infer = httpx.post(f"{server.url}/v2/models/iris-rf/infer", json=IRIS_BODY)
            assert infer.status_code == 200
            assert stub.ServerLive(pb.ServerLiveRequest()).live
            assert not stub.ServerReady(pb.ServerReadyRequest()).ready
            assert stub.ModelReady(pb.ModelReadyRequest(name="iris-rf")).ready
            for service in ("", "iris-rf"):
                request = health_pb2.HealthCheckRequest(service=service)
                assert health.Check(request).status == NOT_SERVING
            signalled_again = time.monotonic()
            server.process.send_signal(signal.SIGTERM)  # the delay (60 s) ends now
            assert server.wait_exit(30) == 0
        assert time.monotonic() - signalled_again < 20
        output = server.output()
    assert "SIGTERM again: the drain delay ends now" in output
    assert "ERROR" not in output and "Traceback" not in output, output


def test_a_model_that_failed_leaves_the_server_live_but_not_ready(tmp_path: Path) -> None:
    build_iris_repository(tmp_path)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.pkl").write_bytes(pickle.dumps(_Explode()))
    with Server(tmp_path, "--workers", "0", "--no-exit-on-error") as server:
        server.wait_live()
        # Both good models loaded (models load in turn): 503 is the failed model's alone.
        for model in ("iris-rf", "iris-logreg"):
            wait_for_status(f"{server.url}/v2/models/{model}/ready", 200, timeout=60)
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 503
        assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
        # Unloaded, the failed model no longer counts: ready.
        unloaded = httpx.post(f"{server.url}/v2/repository/models/broken/unload")
        assert unloaded.status_code == 200
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
        assert httpx.get(f"{server.url}/v2/health/live").status_code == 200


def test_a_signal_during_start_up_waits_for_no_drain_delay(tmp_path: Path) -> None:
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "model.pkl").write_bytes(pickle.dumps([_Sleep(), _Explode()]))
    with Server(tmp_path, "--workers", "0", "--drain-delay", "60") as server:
        server.wait_live()
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 503  # loading
        signalled = time.monotonic()
        assert server.stop(30) == 0
    # Never ready, so in no endpoint list: nothing to wait for (nor for the load).
    assert time.monotonic() - signalled < 15


def test_the_workers_and_the_template_exit_when_the_frontend_is_killed(tmp_path: Path) -> None:
    write_echo_model(tmp_path, "echo")
    with Server(tmp_path, "--workers", "2") as server:
        server.wait_ready()
        processes = psutil.Process(server.process.pid).children(recursive=True)
        assert len(processes) == 3  # the template and two workers
        body = {"inputs": [{"name": "sleep", "shape": [1], "datatype": "FP64", "data": [2]}]}
        busy = threading.Thread(target=_post_until_killed, args=(server, body))
        busy.start()  # a worker is in its predict when the frontend dies
        time.sleep(0.5)
        os.kill(server.process.pid, signal.SIGKILL)
        server.wait_exit(10)
        busy.join(30)
        _, alive = psutil.wait_procs(processes, timeout=15)
        assert not alive, alive


def _post_until_killed(server: Server, body: dict) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server is killed under it
        httpx.post(f"{server.url}/v2/models/echo/infer", json=body, timeout=30)


@pytest.mark.parametrize("rest", [(), ("--http2",)], ids=["uvicorn", "hypercorn"])
def test_no_line_is_logged_twice(iris_repo: Path, rest: tuple[str, ...]) -> None:
    with Server(iris_repo, "--workers", "0", *rest) as server:
        server.wait_ready()
        assert server.stop() == 0
        output = server.output()
    # Without the timestamp, every line of a start and a stop is unique.
    lines = [re.sub(r"^\S+ \S+ ", "", line) for line in output.splitlines() if line]
    twice = [line for line, count in collections.Counter(lines).items() if count > 1]
    assert not twice, output
    assert "INFO inferpool: REST on" in output and "INFO inferpool: stopped" in output, output
