"""grpc.health.v1.Health on both gRPC servers, with grpcio-health-checking's stubs: Check
per service, Watch following readiness through start-up, a failed model, its reload, its
unload and the drain, a Watch's deadline, and a cancelled Watch being let go."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, build_iris_repository, write_custom_model
from tests.support.grpc import IMPLEMENTATIONS

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
TIMEOUT = 20.0

# A model whose load waits for the file ``gate`` in its folder, then fails if it says so.
GATED = """
import time

import numpy as np

from inferpool import Runtime


class Gated(Runtime):
    def load(self):
        gate = self.settings.folder / "gate"
        while not gate.exists():
            time.sleep(0.05)
        if gate.read_text() == "fail":
            raise RuntimeError("the gate says fail")

    def predict(self, payload, outputs):
        return {"output-0": np.asarray(payload)}
"""


def open_gate(gate: Path, text: str) -> None:
    """Write the gate whole, in one rename: the model polls for the file and reads it at
    once, so a gate being written could be read empty (a load that passes, not fails)."""
    staged = gate.with_name("gate.staged")
    staged.write_text(text)
    staged.replace(gate)


def build_gated_repository(root: Path) -> Path:
    """The iris models and ``gated`` (GATED, its gate closed)."""
    build_iris_repository(root)
    write_custom_model(root / "gated", GATED, "Gated")
    return root


class WatchRecorder:
    """A Watch call read by a thread: the statuses received and how the call ended."""

    def __init__(self, stub: health_pb2_grpc.HealthStub, service: str, **kwargs) -> None:
        self.call = stub.Watch(health_pb2.HealthCheckRequest(service=service), **kwargs)
        self.statuses: list[int] = []
        self.code: grpc.StatusCode | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self.statuses.append(message.status)
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            self.code = exc.code()

    def wait_for(
        self, statuses: list[int], timeout: float = TIMEOUT, ignore: int | None = None
    ) -> None:
        """Until the statuses received (less those equal to ``ignore``) are ``statuses``."""

        def seen() -> list[int]:
            return [status for status in self.statuses if status != ignore]

        deadline = time.monotonic() + timeout
        while seen() != statuses and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen() == statuses

    def wait_end(self, timeout: float = TIMEOUT) -> grpc.StatusCode | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the Watch call did not end"
        return self.code


def check(stub: health_pb2_grpc.HealthStub, service: str) -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    return stub.Check(request, timeout=TIMEOUT).status


def wait_state(server: Server, model: str, state: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if httpx.get(f"{server.url}/v2/models/{model}").json().get("state") == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"model {model} never {state}")


def wait_for_log(server: Server, pattern: str, count: int = 1) -> None:
    deadline = time.monotonic() + TIMEOUT
    while len(re.findall(pattern, server.output())) < count:
        assert time.monotonic() < deadline, f"no {count}x {pattern!r} in:\n{server.output()}"
        time.sleep(0.05)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_check_and_watch_follow_readiness(implementation, tmp_path):
    repository = build_gated_repository(tmp_path)
    gate = repository / "gated" / "gate"
    flags = ("--workers", "0", "--grpc-implementation", implementation)
    with (
        Server(repository, *flags, "--no-exit-on-error", "--access-log") as server,
        grpc.insecure_channel(server.grpc_address) as channel,
    ):
        server.wait_live()
        # Live comes before the repository is read: wait until it lists the model.
        wait_state(server, "gated", "LOADING")
        health = health_pb2_grpc.HealthStub(channel)
        inference = GRPCInferenceServiceStub(channel)
        # Starting: a required model is loading.
        assert check(health, "") == NOT_SERVING
        assert check(health, "inference.GRPCInferenceService") == NOT_SERVING
        assert check(health, "gated") == NOT_SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            check(health, "nope")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert "nope" in unknown.value.details()
        server_watch = WatchRecorder(health, "")
        model_watch = WatchRecorder(health, "gated")
        unknown_watch = WatchRecorder(health, "nope")
        short_watch = WatchRecorder(health, "", timeout=1.0)
        server_watch.wait_for([NOT_SERVING])
        model_watch.wait_for([NOT_SERVING])
        unknown_watch.wait_for([SERVICE_UNKNOWN])
        assert short_watch.wait_end() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert short_watch.statuses == [NOT_SERVING]

        # The required model fails: started, but not ready.
        open_gate(gate, "fail")
        wait_state(server, "gated", "FAILED")
        wait_state(server, "iris-rf", "READY")  # in-process models load one at a time
        assert check(health, "") == NOT_SERVING
        assert check(health, "gated") == NOT_SERVING
        assert check(health, "iris-rf") == SERVING
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 503

        # Reloaded fine: both Watches see the flip.
        open_gate(gate, "ok")
        inference.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="gated"))
        server_watch.wait_for([NOT_SERVING, SERVING])
        model_watch.wait_for([NOT_SERVING, SERVING])
        assert check(health, "") == SERVING
        assert check(health, "gated") == SERVING

        # Unloaded: the model stays listed (UNAVAILABLE, as Triton's index), a service that
        # does not serve; the server stays ready.
        inference.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="gated"))
        model_watch.wait_for([NOT_SERVING, SERVING, NOT_SERVING])
        assert check(health, "gated") == NOT_SERVING
        assert check(health, "") == SERVING
        assert server_watch.statuses == [NOT_SERVING, SERVING]

        # A cancelled Watch is let go by the server.
        unknown_watch.call.cancel()
        assert unknown_watch.wait_end() == grpc.StatusCode.CANCELLED
        wait_for_log(server, r"gRPC Watch peer=\S+ model=- version=- status=CANCELLED")

        # The drain: NOT_SERVING, then the Watches end cleanly and the server exits.
        assert server.stop() == 0
        assert server_watch.wait_end() == grpc.StatusCode.OK
        assert server_watch.statuses == [NOT_SERVING, SERVING, NOT_SERVING]
        assert model_watch.wait_end() == grpc.StatusCode.OK
        assert "Traceback" not in server.output()
