"""The tests of MLServer's behaviours around ``predict`` (``parity_runtimes``), shared by
``tests/compat/test_mlmodel_parity.py`` (inferpool's compatibility package) and
``tests/mlserver/test_parity_installed.py`` (MLServer 1.7.1 installed): each module
imports them with the fixtures ``fixtures`` makes (a ``server`` of the repository that
``parity_runtimes.write_repository`` wrote, and that ``repository``), once in worker
processes with the builtin gRPC server and once in-process with grpcio's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.mlserver.parity_runtimes import write_repository
from tests.support import Server
from tests.support.grpc import stub_for

SETUPS = [("1", "builtin"), ("0", "grpcio")]


def fixtures(rewrite: bool) -> tuple[Callable, ...]:
    """The ``served``, ``server`` and ``repository`` fixtures of a module: the runtimes'
    imports rewritten to ``inferpool.mlserver`` (``rewrite``) or as written."""

    @pytest.fixture(scope="module", params=SETUPS, ids=["workers-builtin", "in-process-grpcio"])
    def served(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[tuple[Server, Path]]:
        repository = write_repository(tmp_path_factory.mktemp("parity"), rewrite=rewrite)
        workers, implementation = request.param
        args = ("--workers", workers, "--grpc-implementation", implementation)
        with Server(repository, *args) as running:
            running.wait_ready()
            yield running, repository

    @pytest.fixture
    def server(served: tuple[Server, Path]) -> Server:
        return served[0]

    @pytest.fixture
    def repository(served: tuple[Server, Path]) -> Path:
        return served[1]

    return served, server, repository


def _wait_for_file(path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.05)
    time.sleep(0.05)  # written in one call, but let it land
    return path.read_text()


def fp64_request(values: list[float], request_id: str = "") -> dict:
    return {
        "id": request_id,
        "inputs": [{"name": "x", "datatype": "FP64", "shape": [len(values)], "data": values}],
    }


def test_unload_is_awaited_async_or_sync(server: Server, repository: Path) -> None:
    for name in ("async-unload", "sync-unload"):
        response = httpx.post(f"{server.url}/v2/repository/models/{name}/unload", timeout=60)
        assert response.status_code == 200, response.text
        assert _wait_for_file(repository / name / "unloaded.txt") == f"{name} unloaded"


def test_failing_unload_is_logged_and_the_server_stays_up(server: Server, repository: Path) -> None:
    response = httpx.post(f"{server.url}/v2/repository/models/failing-unload/unload", timeout=60)
    assert response.status_code == 200, response.text
    assert _wait_for_file(repository / "failing-unload" / "unloaded.txt") == "failing-unload tried"
    server.expect_lines([r"failing-unload.*unload\(\) raised", "would not close"], timeout=30)
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    body = fp64_request([1.0])
    assert httpx.post(f"{server.url}/v2/models/tagger/infer", json=body).status_code == 200


def concurrently(base: str, model: str, requests: list[dict]) -> list[httpx.Response]:
    """``requests`` sent to ``model`` at once (a thread each); the responses in order."""
    url = f"{base}/v2/models/{model}/infer"
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda body: client.post(url, json=body), requests))


def sizes_seen(log: Path) -> list[int]:
    """The rows of each predict the doubler ran (its log)."""
    return [int(line) for line in log.read_text().split()]


def test_adaptive_batching_joins_concurrent_requests(server: Server, repository: Path) -> None:
    # 8 requests of 1 or 2 rows at once; max_batch_size 4 (requests), max_batch_time 1 s.
    requests = [fp64_request([float(i)] * (1 + i % 2), f"req-{i}") for i in range(8)]
    responses = concurrently(server.url, "doubler", requests)
    for i, response in enumerate(responses):
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["id"] == f"req-{i}"  # each request's own id, as MLServer's split
        (output,) = body["outputs"]
        assert output["shape"] == [1 + i % 2, 1]  # NumpyCodec adds the column
        assert output["data"] == [2.0 * i] * (1 + i % 2)
    sizes = sizes_seen(repository / "doubler" / "batches.log")
    assert sum(sizes) == sum(1 + i % 2 for i in range(8))  # every row predicted once
    assert len(sizes) < 8, sizes  # some requests were predicted together
    assert max(sizes) <= 8, sizes  # at most 4 requests of at most 2 rows


def test_max_batch_size_alone_does_not_batch(server: Server, repository: Path) -> None:
    # MLServer batches only with max_batch_time > 0 as well.
    requests = [fp64_request([float(i)] * 2) for i in range(6)]
    responses = concurrently(server.url, "doubler-unbatched", requests)
    assert all(response.status_code == 200 for response in responses)
    assert sizes_seen(repository / "doubler-unbatched" / "batches.log") == [2] * 6


def test_response_headers_are_http_headers(server: Server) -> None:
    body = fp64_request([1.0, 2.0])
    response = httpx.post(f"{server.url}/v2/models/tagger/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["x-model-tag"] == "blue"
    assert response.headers["x-rows"] == "2"
    # Out of the JSON body, as MLServer takes them (its other parameters stay).
    assert response.json()["parameters"] == {"content_type": "np"}


def test_response_headers_are_grpc_trailing_metadata(server: Server) -> None:
    request = pb.ModelInferRequest(model_name="tagger")
    tensor = request.inputs.add(name="x", datatype="FP64", shape=[3])
    tensor.contents.fp64_contents.extend([1.0, 2.0, 3.0])
    with stub_for(server) as stub:
        response, call = stub.ModelInfer.with_call(request, timeout=30)
    trailing = dict(call.trailing_metadata())
    assert trailing["x-model-tag"] == "blue"  # keys lower-cased, as MLServer's
    assert trailing["x-rows"] == "3"
    assert "x-request-id" in trailing  # inferpool's own stays
    assert "headers" not in response.parameters
    assert np.allclose(response.outputs[0].contents.fp64_contents, [1.0, 2.0, 3.0])
