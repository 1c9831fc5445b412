"""``--api-keys-file`` end to end: REST (httpx, tritonclient http) and both gRPC servers
(grpcio metadata, tritonclient grpc), probes open, keys limited to models, the file
rotated under a running server, the admin token apart, and no key in the log."""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import time

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, build_iris_repository
from tests.support.grpc import infer_request
from tests.support.stream_calls import Conversation

OPS = "ops-8d1f0c2b7e4a9f36"
IRIS = "iris-3c5e7a9b1d2f4e60"
ADMIN = "admin-token-55aa"
KEYS = f"""# the operators' key: every model
{OPS}  label=ops
{IRIS}  iris-logreg   label=iris-team  # only this model
"""
ROW = [5.1, 3.5, 1.4, 0.2]
BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": ROW}]}
SETUPS = {
    "uvicorn+builtin": (),
    "hypercorn+grpcio": ("--http2", "--grpc-implementation", "grpcio"),
}


@pytest.fixture(scope="module", params=list(SETUPS))
def server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    repository = build_iris_repository(root / "repo")
    keys = root / "keys.txt"
    keys.write_text(KEYS)
    flags = ("--workers", "1", "--api-keys-file", str(keys), "--access-log", "--admin-token", ADMIN)
    with Server(repository, *flags, *SETUPS[request.param]) as running:
        running.wait_ready()
        running.keys = keys
        yield running


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}  # lower case: gRPC metadata keys are


def _infer(server: Server, model: str = "iris-logreg", **headers) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v2/models/{model}/infer", json=BODY, headers=headers, timeout=30
    )


def test_rest_needs_a_key(server):
    missing = _infer(server)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == 'Bearer realm="inferpool"'
    assert "API key" in missing.json()["error"]
    wrong = _infer(server, **_auth("not-a-key"))
    assert wrong.status_code == 401
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
    assert _infer(server, **_auth(OPS)).status_code == 200
    assert _infer(server, **{"X-API-Key": OPS}).status_code == 200
    assert _infer(server, "iris-rf", **_auth(OPS)).status_code == 200
    assert _infer(server, **_auth(IRIS)).status_code == 200
    refused = _infer(server, "iris-rf", **_auth(IRIS))
    assert refused.status_code == 403 and "iris-rf" in refused.json()["error"]
    assert httpx.get(f"{server.url}/v2", timeout=10).status_code == 401
    assert httpx.get(f"{server.url}/v2", headers=_auth(OPS), timeout=10).status_code == 200


def test_probes_stay_open(server):
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/iris-rf/ready"):
        assert httpx.get(server.url + path, timeout=10).status_code == 200, path
    metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
    assert metrics.status_code == 200
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        assert stub.ModelReady(pb.ModelReadyRequest(name="iris-rf"), timeout=10).ready
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        check = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        assert check.status == health_pb2.HealthCheckResponse.SERVING


def _grpc_code(method, request, *metadata: tuple[str, str]) -> grpc.StatusCode:
    """The status of one call of ``method`` with ``metadata``."""
    try:
        method(request, timeout=30, metadata=metadata or None)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_grpc_needs_a_key(server):
    request = infer_request("iris-logreg", x=np.array([ROW]))
    other = infer_request("iris-rf", x=np.array([ROW]))
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        infer = stub.ModelInfer
        codes = {
            "none": _grpc_code(infer, request),
            "wrong": _grpc_code(infer, request, ("authorization", "Bearer nope")),
            "bearer": _grpc_code(infer, request, ("authorization", f"Bearer {OPS}")),
            "x-api-key": _grpc_code(infer, request, ("x-api-key", IRIS)),
            "scoped": _grpc_code(infer, other, ("x-api-key", IRIS)),
            "metadata": _grpc_code(stub.ServerMetadata, pb.ServerMetadataRequest()),
        }
    assert codes == {
        "none": grpc.StatusCode.UNAUTHENTICATED,
        "wrong": grpc.StatusCode.UNAUTHENTICATED,
        "bearer": grpc.StatusCode.OK,
        "x-api-key": grpc.StatusCode.OK,
        "scoped": grpc.StatusCode.PERMISSION_DENIED,
        "metadata": grpc.StatusCode.UNAUTHENTICATED,
    }
    # A stream: every request's model is checked against the call's key.
    stream = Conversation(
        server.grpc_address, pb.ModelStreamInferResponse, metadata=[("x-api-key", IRIS)]
    )
    stream.send(request)
    assert not stream.receive().error_message
    stream.send(other)
    with pytest.raises(grpc.RpcError) as ended:
        stream.receive()
    assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED
    stream.channel.close()


def test_tritonclient_headers(server):
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http
    from tritonclient.utils import InferenceServerException

    for module, address in (
        (triton_http, server.url[len("http://") :]),
        (triton_grpc, server.grpc_address),
    ):
        client = module.InferenceServerClient(address)
        tensor = module.InferInput("x", [1, 4], "FP64")
        tensor.set_data_from_numpy(np.array([ROW]))
        assert client.infer("iris-logreg", [tensor], headers=_auth(OPS)).as_numpy(
            "predict"
        ).tolist() == [0]
        with pytest.raises(InferenceServerException, match="API key"):
            client.infer("iris-logreg", [tensor])
        assert client.is_server_live()  # a probe, without a key
        client.close()


def test_admin_token_stays_separate(server):
    url = f"{server.url}/v2/repository/models/iris-rf"
    # Load and unload answer to the admin token alone, not to an API key.
    assert httpx.post(url + "/load", headers=_auth(OPS), timeout=60).status_code == 401
    assert httpx.post(url + "/load", headers=_auth(ADMIN), timeout=60).status_code == 200
    # The admin token is no API key.
    assert _infer(server, **_auth(ADMIN)).status_code == 401
    index = httpx.post(f"{server.url}/v2/repository/index", headers=_auth(OPS), timeout=10)
    assert index.status_code == 200


def test_model_repository_service_keeps_the_same_rules(server):
    """MLServer's inference.model_repository service: load and unload answer to the admin
    token alone, as GRPCInferenceService's; the index to an API key."""
    from inferpool.protocol.generated import model_repository_pb2 as mr
    from inferpool.protocol.generated.model_repository_pb2_grpc import (
        ModelRepositoryServiceStub,
    )

    load = mr.RepositoryModelLoadRequest(model_name="iris-rf")
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = ModelRepositoryServiceStub(channel)
        assert _grpc_code(stub.RepositoryModelLoad, load) == grpc.StatusCode.UNAUTHENTICATED
        code = _grpc_code(stub.RepositoryModelLoad, load, ("authorization", f"Bearer {OPS}"))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code = _grpc_code(stub.RepositoryModelLoad, load, ("authorization", f"Bearer {ADMIN}"))
        assert code == grpc.StatusCode.OK
        index = mr.RepositoryIndexRequest()
        assert _grpc_code(stub.RepositoryIndex, index) == grpc.StatusCode.UNAUTHENTICATED
        assert _grpc_code(stub.RepositoryIndex, index, ("x-api-key", OPS)) == grpc.StatusCode.OK


def test_rotated_key_file_takes_effect(server):
    new = "rotated-4b6d8f0a2c4e6a8c"
    tmp = server.keys.with_suffix(".tmp")
    try:
        tmp.write_text(KEYS.replace(OPS, new))
        os.replace(tmp, server.keys)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _infer(server, **_auth(new)).status_code != 200:
            time.sleep(0.2)
        assert _infer(server, **_auth(new)).status_code == 200
        assert _infer(server, **_auth(OPS)).status_code == 401
        with grpc.insecure_channel(server.grpc_address) as channel:
            call = GRPCInferenceServiceStub(channel).ServerMetadata
            code = _grpc_code(call, pb.ServerMetadataRequest(), ("x-api-key", new))
            assert code == grpc.StatusCode.OK
    finally:
        tmp.write_text(KEYS)
        os.replace(tmp, server.keys)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _infer(server, **_auth(OPS)).status_code != 200:
        time.sleep(0.2)
    server.expect_lines([r"the API key file reloaded"])


def test_hostile_headers_and_a_burst_of_wrong_keys(server):
    huge = _infer(server, authorization="Bearer " + "k" * 60_000)
    assert huge.status_code in (401, 431, 400)
    assert huge.status_code != 500
    keyed: list[float] = []
    url = f"{server.url}/v2/models/iris-logreg/infer"
    with (
        httpx.Client(timeout=30) as client,
        httpx.Client(timeout=30, limits=httpx.Limits(max_connections=4)) as guesser,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):

        def wrong(i: int) -> int:
            return guesser.post(url, json=BODY, headers=_auth(f"guess-{i:06d}")).status_code

        burst = [pool.submit(wrong, i) for i in range(300)]
        while not all(f.done() for f in burst):
            started = time.perf_counter()
            assert client.post(url, json=BODY, headers=_auth(OPS)).status_code == 200
            keyed.append(time.perf_counter() - started)
        assert {f.result() for f in burst} == {401}
    # Generous: the keyed client is served in the middle of the burst, not after it.
    assert keyed and statistics.median(keyed) < 0.5, keyed


def test_no_key_is_logged(server):
    _infer(server, **_auth("wrong-secret-guess-9f9f"))
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        guess = ("x-api-key", "wrong-grpc-guess-7e7e")
        assert _grpc_code(stub.ServerMetadata, pb.ServerMetadataRequest(), guess) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        stub.ServerMetadata(pb.ServerMetadataRequest(), metadata=[("x-api-key", OPS)], timeout=10)
    _infer(server, **_auth(IRIS))
    # The access log names the key by its label, never by itself.
    output = server.expect_lines(
        [
            r"\b401\b",
            r"ServerMetadata",
            r"status=200 .* api_key=iris-team",
            r"ServerMetadata .*status=OK .* api_key=ops",
        ]
    )
    for secret in (OPS, IRIS, ADMIN, "wrong-secret-guess-9f9f", "wrong-grpc-guess-7e7e"):
        assert secret not in output
