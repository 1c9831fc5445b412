"""Request priorities end to end (``protocol/priority.py``, ``engine/worker/batching.py``):
a slow custom model saturated with low-priority requests, then high-priority ones (by
``parameters.priority`` and by the ``inferpool-priority`` header / metadata) finish ahead
of the low ones still queued, over REST and gRPC; a bad priority is a 400 /
INVALID_ARGUMENT. One server, one worker."""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, write_custom_model

pytestmark = pytest.mark.timeout(300)

# Each call waits until the test opens the gate (a file), then takes 20 ms: the
# requests sent meanwhile queue behind the first one, however loaded the machine.
SLOW = """
import os
import time

from inferpool import Runtime


class Slow(Runtime):
    def load(self):
        self.gate = self.settings.parameters.extra["gate"]

    def predict(self, payload, outputs):
        deadline = time.monotonic() + 60
        while not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.02)
        return {outputs[0]: payload.sum(axis=1)}
"""
LOW, HIGH = 6, 2  # requests of each kind in a scenario
TENSOR = {"name": "x", "datatype": "FP64", "shape": [1, 3], "data": [1.0, 2.0, 3.0]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("priority") / "repo"
    gate = root.parent / "gate"
    gate.touch()  # open, but for the scenarios that close it
    write_custom_model(
        root / "slow", SLOW, "Slow", parameters={"extra": {"gate": str(gate)}},
        inputs=[{"name": "x", "datatype": "FP64", "shape": [-1, 3]}],
        outputs=[{"name": "sum", "datatype": "FP64", "shape": [-1]}],
    )  # fmt: skip
    with Server(root, "--workers", "1") as running:
        running.wait_ready()
        running.gate = gate
        yield running


def _in_flight(server: Server) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    found = re.search(
        r'^inferpool_model_in_flight_requests\{model="slow",version=""\} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


def _completion_order(
    server: Server, low: Callable[[int], None], highs: list[Callable[[], None]]
) -> list[str]:
    """With the gate closed, send ``LOW`` low-priority requests and wait until the engine
    holds them all (the first one runs, waiting for the gate; the others queue), then the
    high ones, and open the gate: the tags in the order the requests ended."""
    done: list[str] = []
    lock = threading.Lock()

    def run(tag: str, call: Callable[[], None]) -> None:
        call()
        with lock:
            done.append(tag)

    server.gate.unlink()
    try:
        with concurrent.futures.ThreadPoolExecutor(LOW + HIGH) as pool:
            futures = [pool.submit(run, f"low{i}", lambda i=i: low(i)) for i in range(LOW)]
            _wait_in_flight(server, LOW)
            futures += [pool.submit(run, f"high{i}", call) for i, call in enumerate(highs)]
            _wait_in_flight(server, LOW + HIGH)
            server.gate.touch()
            for future in futures:
                future.result()
    finally:
        server.gate.touch()
    return done


def _wait_in_flight(server: Server, count: int) -> None:
    deadline = time.monotonic() + 30
    while _in_flight(server) < count:
        assert time.monotonic() < deadline, f"fewer than {count} requests ever in flight"
        time.sleep(0.02)


def _assert_highs_ran_first(done: list[str]) -> None:
    last_high = max(done.index(f"high{i}") for i in range(HIGH))
    lows_before = [tag for tag in done[:last_high] if tag.startswith("low")]
    # The first low one was running when the high ones came; without priorities all LOW
    # would come first.
    assert len(lows_before) == 1, done


def _post(server: Server, priority: object = None, header: str | None = None) -> httpx.Response:
    """An inference asking for ``priority`` in its parameters, ``header`` in its header."""
    body: dict = {"inputs": [TENSOR]}
    if priority is not None:
        body["parameters"] = {"priority": priority}
    headers = {} if header is None else {"inferpool-priority": header}
    return httpx.post(f"{server.url}/v2/models/slow/infer", json=body, headers=headers, timeout=60)


def _rest(server: Server, priority: int | None = None, header: str | None = None) -> None:
    reply = _post(server, priority, header)
    assert reply.status_code == 200, reply.text


def test_rest_high_priority_requests_overtake_the_queued_low_ones(server: Server) -> None:
    # Half the low ones say nothing: by default they rank below any level asked for.
    def low(i: int) -> None:
        _rest(server, 10 if i % 2 else None)

    highs = [lambda: _rest(server, 1), lambda: _rest(server, header="1")]
    _assert_highs_ran_first(_completion_order(server, low, highs))


def _grpc_request(parameter: str | None = None, value: int = 0) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="slow")
    tensor = request.inputs.add(name="x", datatype="FP64", shape=[1, 3])
    tensor.contents.fp64_contents.extend([1.0, 2.0, 3.0])
    if parameter is not None:
        setattr(request.parameters["priority"], parameter, value)
    return request


def test_grpc_high_priority_requests_overtake_the_queued_low_ones(server: Server) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)

        def call(request: pb.ModelInferRequest, metadata: tuple = ()) -> None:
            reply = stub.ModelInfer(request, metadata=metadata, timeout=60)
            assert np.allclose(reply.outputs[0].contents.fp64_contents, [6.0])

        def low(i: int) -> None:
            call(_grpc_request("uint64_param", 10))

        highs = [
            lambda: call(_grpc_request("int64_param", 1)),
            lambda: call(_grpc_request(), (("inferpool-priority", "1"),)),
        ]
        _assert_highs_ran_first(_completion_order(server, low, highs))


@pytest.mark.parametrize(
    ("priority", "header"),
    [(-1, None), (1.5, None), ("high", None), (True, None), (2**64, None), (None, "soon")],
)
def test_rest_a_bad_priority_is_a_400(server: Server, priority, header) -> None:
    reply = _post(server, priority, header)
    assert reply.status_code == 400, reply.text
    assert "priority must be a whole number from 0" in reply.json()["error"]


def test_grpc_a_bad_priority_is_invalid_argument(server: Server) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        bad = [
            (_grpc_request("int64_param", -3), ()),
            (_grpc_request("bool_param", True), ()),
            (_grpc_request(), (("inferpool-priority", "-1"),)),
        ]
        for request, metadata in bad:
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(request, metadata=metadata, timeout=30)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "priority must be a whole number" in refused.value.details()
        # Priority 0 asks for the model's default: served as any request.
        stub.ModelInfer(_grpc_request("uint64_param", 0), timeout=30)
