"""The rest of GRPCInferenceService: health, metadata, repository, statistics, errors."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, iris_data
from tests.support.grpc import (
    IMPLEMENTATIONS,
    SETUPS,
    build_grpc_repository,
    infer_request,
    needs_pool,
    running_server,
    setup_server,
    stub_for,
)


@pytest.fixture(scope="module", params=SETUPS)
def server(request, tmp_path_factory):
    with setup_server(request.param, tmp_path_factory.mktemp("grpc-service")) as server:
        yield server


@pytest.fixture(scope="module")
def stub(server):
    with stub_for(server) as stub:
        yield stub


def rpc_error(call, request, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, **kwargs)
    return caught.value


def rest_error(server: Server, model: str, body: dict) -> tuple[int, str]:
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body)
    return response.status_code, response.json()["error"]


def test_health(stub):
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert stub.ServerReady(pb.ServerReadyRequest()).ready
    assert stub.ModelReady(pb.ModelReadyRequest(name="iris-rf")).ready


def test_server_metadata(stub):
    response = stub.ServerMetadata(pb.ServerMetadataRequest())
    assert response.name == "inferpool"
    assert response.version
    assert {"model_repository", "statistics"} <= set(response.extensions)


def test_model_metadata_matches_rest(server, stub):
    response = stub.ModelMetadata(pb.ModelMetadataRequest(name="iris-logreg"))
    rest = httpx.get(f"{server.url}/v2/models/iris-logreg").json()
    assert response.name == rest["name"]
    assert response.platform == rest["platform"] == "sklearn"
    for ours, theirs in ((response.inputs, rest["inputs"]), (response.outputs, rest["outputs"])):
        assert [(t.name, t.datatype, list(t.shape)) for t in ours] == [
            (t["name"], t["datatype"], t["shape"]) for t in theirs
        ]


def test_unknown_model_or_version_is_not_found_with_rests_message(server, stub):
    X, _ = iris_data()
    error = rpc_error(stub.ModelInfer, infer_request("no-such-model", x=X[:1]))
    assert error.code() is grpc.StatusCode.NOT_FOUND
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [1, 2, 3, 4]}]}
    assert rest_error(server, "no-such-model", body) == (404, error.details())

    request = infer_request("iris-rf", x=X[:1])
    request.model_version = "7"
    error = rpc_error(stub.ModelInfer, request)
    assert error.code() is grpc.StatusCode.NOT_FOUND
    assert error.details() == "model 'iris-rf' has no version '7'"

    for call, message in (
        (stub.ModelReady, pb.ModelReadyRequest(name="no-such-model")),
        (stub.ModelMetadata, pb.ModelMetadataRequest(name="no-such-model")),
        (stub.ModelStatistics, pb.ModelStatisticsRequest(name="no-such-model")),
    ):
        assert rpc_error(call, message).code() is grpc.StatusCode.NOT_FOUND


def test_bad_tensors_are_invalid_argument_with_rests_message(server, stub):
    X, _ = iris_data()
    error = rpc_error(stub.ModelInfer, infer_request("iris-logreg", x=X[:2, :3]))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    body = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP64", "data": [0] * 6}]}
    assert rest_error(server, "iris-logreg", body) == (400, error.details())
    assert "expects 4 features, got 3" in error.details()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda t: t.contents.fp64_contents.extend([1.0, 2.0]), "needs 4 values, got 2"),
        (lambda t: t.contents.int_contents.extend([1, 2, 3, 4]), "belongs in fp64_contents"),
        (lambda t: setattr(t, "datatype", "FP8"), "unknown datatype 'FP8'"),
    ],
)
def test_malformed_inputs_are_invalid_argument(stub, build, message):
    request = pb.ModelInferRequest(model_name="iris-logreg")
    tensor = request.inputs.add(name="x", datatype="FP64", shape=[1, 4])
    build(tensor)
    error = rpc_error(stub.ModelInfer, request)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.details()


def test_raw_and_typed_inputs_cannot_mix(stub):
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="a", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    request.inputs.add(name="b", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.int32(2).tobytes())
    error = rpc_error(stub.ModelInfer, request)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "send every input raw, or none" in error.details()


def test_a_body_that_is_not_a_request_is_invalid_argument(server):
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        error = rpc_error(call, b"\x0a\xff\xff")
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid inference.ModelInferRequest" in error.details()


def test_a_model_that_raises_is_internal(stub):
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="fail", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    error = rpc_error(stub.ModelInfer, request)
    assert error.code() is grpc.StatusCode.INTERNAL
    assert error.details() == "model 'echo' raised ValueError: asked to fail"


def test_a_failed_model_is_unavailable_until_unloaded(server, stub):
    broken = server.repository / "broken"
    shutil.copytree(server.repository / "iris-rf", broken)
    (broken / "model.joblib").write_bytes(b"not a model")
    try:
        error = rpc_error(
            stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="broken")
        )
        assert error.code() is grpc.StatusCode.INTERNAL
        assert "model 'broken' failed to load" in error.details()

        X, _ = iris_data()
        error = rpc_error(stub.ModelInfer, infer_request("broken", x=X[:1]))
        assert error.code() is grpc.StatusCode.UNAVAILABLE
        assert error.details().startswith("model 'broken' failed to load")
        assert not stub.ModelReady(pb.ModelReadyRequest(name="broken")).ready
        # It never served: its failure went to the caller and the server stays ready.
        assert stub.ServerReady(pb.ServerReadyRequest()).ready
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest())
        assert {m.name: m.state for m in index.models}["broken"] == "FAILED"
    finally:
        stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="broken"))
        shutil.rmtree(broken)
    assert stub.ServerReady(pb.ServerReadyRequest()).ready


def test_repository_unload_then_load(stub):
    X, _ = iris_data()
    stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="iris-rf"))
    try:
        ready_only = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
        assert "iris-rf" not in [m.name for m in ready_only.models]
        error = rpc_error(stub.ModelInfer, infer_request("iris-rf", x=X[:1]))
        # Listed as unloaded (as Triton), answering NOT_FOUND: nothing serves it.
        assert error.code() is grpc.StatusCode.NOT_FOUND
        assert "was unloaded" in error.details()
    finally:
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="iris-rf"))
    assert stub.ModelInfer(infer_request("iris-rf", x=X[:1])).outputs[0].name == "predict"
    index = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
    assert {m.name: m.state for m in index.models}["iris-rf"] == "READY"


def test_loading_a_model_not_in_the_repository_is_not_found(stub):
    request = pb.RepositoryModelLoadRequest(model_name="no-such-model")
    assert rpc_error(stub.RepositoryModelLoad, request).code() is grpc.StatusCode.NOT_FOUND


def test_statistics_count_successes_and_failures(stub):
    X, _ = iris_data()
    before = stub.ModelStatistics(pb.ModelStatisticsRequest(name="iris-logreg")).model_stats[0]
    stub.ModelInfer(infer_request("iris-logreg", x=X[:3]))
    rpc_error(stub.ModelInfer, infer_request("iris-logreg", x=X[:1, :2]))

    (after,) = stub.ModelStatistics(pb.ModelStatisticsRequest(name="iris-logreg")).model_stats

    assert after.name == "iris-logreg"
    stats, old = after.inference_stats, before.inference_stats
    assert stats.success.count == old.success.count + 1
    assert stats.fail.count == old.fail.count + 1
    assert stats.compute_infer.ns > old.compute_infer.ns
    everything = stub.ModelStatistics(pb.ModelStatisticsRequest())
    assert {"iris-logreg", "iris-rf", "echo"} <= {s.name for s in everything.model_stats}


def echo_request(sleep: float = 0.0, mark: Path | None = None) -> pb.ModelInferRequest:
    """An echo request that writes its pid to ``mark`` when it reaches the model, then sleeps."""
    request = pb.ModelInferRequest(model_name="echo")
    if mark is not None:
        tensor = request.inputs.add(name="mark", datatype="BYTES", shape=[1])
        tensor.contents.bytes_contents.append(str(mark).encode())
    if sleep:
        request.inputs.add(name="sleep", datatype="FP64", shape=[1]).contents.fp64_contents.append(
            sleep
        )
    request.inputs.add(name="a", datatype="INT32", shape=[1]).contents.int_contents.append(5)
    return request


def wait_for_file(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout}s"
        time.sleep(0.02)


def test_a_request_whose_deadline_passed_is_not_run(server, stub, tmp_path):
    """Keep every worker (or the loop) busy, so a short-deadline request waits past it."""
    started = [tmp_path / f"busy-{i}" for i in range(max(1, server.workers))]
    sleepers = [
        threading.Thread(target=stub.ModelInfer, args=(echo_request(1.5, mark),))
        for mark in started
    ]
    for thread in sleepers:
        thread.start()
    for mark in started:
        wait_for_file(mark)
    late = tmp_path / "late-ran"

    error = rpc_error(stub.ModelInfer, echo_request(mark=late), timeout=0.3)

    assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    for thread in sleepers:
        thread.join(10)
    time.sleep(0.5)
    assert not late.exists(), "a request past its deadline reached the model"


def test_grpc_port_zero_disables_grpc(iris_repo):
    with Server(iris_repo, "--workers", "0", "--grpc-port", "0") as server:
        server.wait_ready()
        assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            live = GRPCInferenceServiceStub(channel).ServerLive
            error = rpc_error(live, pb.ServerLiveRequest(), timeout=2)
        assert error.code() is grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("setup", SETUPS)
def test_shutdown_lets_an_in_flight_call_finish(setup, tmp_path):
    workers, implementation = setup
    repository = build_grpc_repository(tmp_path / "repo")
    with (
        running_server(repository, workers, implementation=implementation) as server,
        stub_for(server) as stub,
    ):
        running = tmp_path / "running"
        future = stub.ModelInfer.future(echo_request(1.0, running))
        wait_for_file(running)
        server.process.terminate()
        response = future.result(timeout=30)
        assert list(response.outputs[0].contents.int_contents) == [5]
        assert server.wait_exit(60) == 0


@needs_pool
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_call_still_running_when_the_shutdown_grace_ends_is_unavailable(implementation, tmp_path):
    repository = build_grpc_repository(tmp_path / "repo")
    grace = ("--shutdown-timeout", "0.5")
    with (
        running_server(repository, 2, *grace, implementation=implementation) as server,
        stub_for(server) as stub,
    ):
        running = tmp_path / "running"
        future = stub.ModelInfer.future(echo_request(5.0, running), timeout=30)
        wait_for_file(running)
        server.process.terminate()
        with pytest.raises(grpc.RpcError) as caught:
            future.result(timeout=30)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        assert server.wait_exit(60) == 0


@needs_pool
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_full_queue_is_unavailable_with_a_retry_pushback(implementation, tmp_path):
    repository = build_grpc_repository(tmp_path / "repo")
    with (
        running_server(repository, 1, "--max-queue", "1", implementation=implementation) as server,
        stub_for(server) as stub,
    ):
        futures = [stub.ModelInfer.future(echo_request(0.5)) for _ in range(4)]
        refused = []
        for future in futures:
            try:
                future.result(timeout=30)
            except grpc.RpcError as error:
                refused.append(error)
    assert 0 < len(refused) < len(futures)
    for error in refused:
        assert error.code() is grpc.StatusCode.UNAVAILABLE
        assert "overloaded" in error.details()
        assert ("grpc-retry-pushback-ms", "1000") in [tuple(m) for m in error.trailing_metadata()]


@needs_pool
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_lost_worker_is_unavailable_and_the_pool_recovers(implementation, tmp_path):
    repository = build_grpc_repository(tmp_path / "repo")
    with (
        running_server(repository, 2, implementation=implementation) as server,
        stub_for(server) as stub,
    ):
        running = tmp_path / "running"
        future = stub.ModelInfer.future(echo_request(5.0, running))
        wait_for_file(running)
        os.kill(int(running.read_text()), signal.SIGKILL)

        with pytest.raises(grpc.RpcError) as caught:
            future.result(timeout=30)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        assert caught.value.details()

        deadline = time.monotonic() + 60
        while True:
            try:
                response = stub.ModelInfer(echo_request(), timeout=10)
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline, "the pool did not recover"
                time.sleep(0.2)
        assert list(response.outputs[0].contents.int_contents) == [5]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_taken_grpc_port_exits_1_naming_it(implementation, iris_repo):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = ("--grpc-port", str(port), "--grpc-implementation", implementation)
        with Server(iris_repo, "--workers", "0", *flags) as server:
            assert server.wait_exit(60) == 1
            assert f"cannot listen on 127.0.0.1:{port} for gRPC" in server.output()
