"""MLServer's behaviours around ``predict``, with MLServer 1.7.1 installed: the runtimes
of ``tests/mlserver/parity_runtimes.py`` unchanged (``from mlserver import MLModel``);
``unload()`` awaited, adaptive batching, response headers over REST and gRPC (the tests
are ``parity_cases.py``'s), in worker processes with the builtin gRPC server and
in-process with grpcio's. Run by tox's ``mlserver`` environment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.mlserver.parity_cases import (  # noqa: F401 - collected here
    concurrently,
    fixtures,
    fp64_request,
    sizes_seen,
    test_adaptive_batching_joins_concurrent_requests,
    test_failing_unload_is_logged_and_the_server_stays_up,
    test_max_batch_size_alone_does_not_batch,
    test_response_headers_are_grpc_trailing_metadata,
    test_response_headers_are_http_headers,
    test_unload_is_awaited_async_or_sync,
)
from tests.mlserver.parity_runtimes import write_repository
from tests.support import Server
from tests.support.mlserver import running_mlserver

served, server, repository = fixtures(rewrite=False)


@pytest.fixture(scope="module")
def beside(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """MLServer 1.7.1 itself on a repository of the same runtimes: its REST URL, gRPC
    address and the repository (the batching model's log is there)."""
    folder = write_repository(tmp_path_factory.mktemp("beside"), rewrite=False)
    with running_mlserver(folder) as (url, address):
        yield url, address, folder


def test_response_headers_as_mlserver_sends_them_over_rest(server: Server, beside) -> None:
    url = "/v2/models/tagger/infer"
    ours = httpx.post(server.url + url, json=fp64_request([1.0, 2.0]), timeout=30)
    theirs = httpx.post(beside[0] + url, json=fp64_request([1.0, 2.0]), timeout=30)
    for header in ("x-model-tag", "x-rows"):
        assert ours.headers[header] == theirs.headers[header]
    assert ours.json()["parameters"] == theirs.json()["parameters"]
    assert ours.json()["outputs"] == theirs.json()["outputs"]


def _trailing(address: str) -> tuple[dict, object]:
    request = pb.ModelInferRequest(model_name="tagger")
    tensor = request.inputs.add(name="x", datatype="FP64", shape=[2])
    tensor.contents.fp64_contents.extend([1.0, 2.0])
    with grpc.insecure_channel(address) as channel:
        response, call = GRPCInferenceServiceStub(channel).ModelInfer.with_call(request, timeout=30)
    return dict(call.trailing_metadata()), response


def test_response_headers_as_mlserver_sends_them_over_grpc(server: Server, beside) -> None:
    ours, our_response = _trailing(server.grpc_address)
    theirs, their_response = _trailing(beside[1])
    for key in ("x-model-tag", "x-rows"):
        assert ours[key] == theirs[key]
    assert set(our_response.parameters) == set(their_response.parameters)


def test_adaptive_batching_answers_as_mlserver(server: Server, repository: Path, beside) -> None:
    requests = [fp64_request([float(i)] * (1 + i % 2), f"req-{i}") for i in range(8)]
    answers = []
    for base, folder in ((server.url, repository), (beside[0], beside[2])):
        log = folder / "doubler" / "batches.log"
        log.write_text("")  # this test's predicts only
        responses = concurrently(base, "doubler", requests)
        answers.append([(r.json()["id"], r.json()["outputs"]) for r in responses])
        sizes = sizes_seen(log)
        assert sum(sizes) == 12 and len(sizes) < 8, sizes  # both joined some requests
    assert answers[0] == answers[1]
