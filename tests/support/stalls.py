"""Helpers for the stalled-worker tests: probes that ask a model without pause over REST or
gRPC and keep each answer's latency, and the memory of a server's process tree."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import grpc
import httpx
import numpy as np
import psutil

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server
from tests.support.grpc import infer_request

IRIS_ROW = [[5.1, 3.5, 1.4, 0.2]]


@dataclass
class Probe:
    """A thread asking ``model`` one request after the other until ``stop``; each answer's
    (start, seconds, status): the HTTP status, or the gRPC status code's name."""

    server: Server
    model: str
    protocol: str  # "rest" or "grpc"
    answers: list[tuple[float, float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Probe:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)

    def _run(self) -> None:
        if self.protocol == "rest":
            self._run_rest()
        else:
            self._run_grpc()

    def _run_rest(self) -> None:
        url = f"{self.server.url}/v2/models/{self.model}/infer"
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": IRIS_ROW}]}
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    status = str(client.post(url, json=body).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                self.answers.append((started, time.monotonic() - started, status))

    def _run_grpc(self) -> None:
        request = infer_request(self.model, x=np.array(IRIS_ROW))
        with grpc.insecure_channel(self.server.grpc_address) as channel:
            stub = GRPCInferenceServiceStub(channel)
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    stub.ModelInfer(request, timeout=60)
                    status = "OK"
                except grpc.RpcError as exc:
                    status = exc.code().name
                self.answers.append((started, time.monotonic() - started, status))

    def p99(self) -> float:
        return float(np.percentile([seconds for _, seconds, _ in self.answers], 99))

    def slowest(self) -> float:
        return max(seconds for _, seconds, _ in self.answers)

    def statuses(self) -> set[str]:
        return {status for _, _, status in self.answers}


def tree_memory(pid: int) -> tuple[int, int]:
    """(processes, summed proportional set size in bytes) of ``pid`` and its descendants:
    pages shared copy-on-write count once in all."""
    root = psutil.Process(pid)
    processes = [root, *root.children(recursive=True)]
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return len(processes), total


def metric(text: str, name: str) -> float:
    """The value of an unlabelled metric in a Prometheus text page (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0
