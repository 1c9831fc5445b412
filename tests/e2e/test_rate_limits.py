"""Rate limits end to end (``engine/rate_limits.py``): a model's ``parameters.rate_limit``
and an API key's ``rate=``, over REST (429, Retry-After) and both gRPC servers
(RESOURCE_EXHAUSTED, ``grpc-retry-pushback-ms``), under a burst from many clients; the
requests at the rate all pass, other models and keys keep their latency, /metrics counts
the refusals; both gRPC servers read the priority metadata. One server per gRPC
implementation, several assertions each."""

from __future__ import annotations

import concurrent.futures
import json
import math
import re
import time

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, build_iris_repository
from tests.support.grpc import infer_request

FREE = "free-key-0a1b2c3d4e5f"
SLOW = "slow-key-9f8e7d6c5b4a"
KEYS = f"""{FREE}  label=free
{SLOW}  label=slow rate=2 burst=2
"""
RATE, BURST = 4, 2  # the limited model's: requests/s, at once
ROW = [5.1, 3.5, 1.4, 0.2]
X = np.array([ROW])
BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": ROW}]}
SETUPS = {"builtin": (), "grpcio": ("--grpc-implementation", "grpcio")}


@pytest.fixture(scope="module", params=list(SETUPS))
def server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("rates")
    repository = build_iris_repository(root / "repo")
    settings = {
        "name": "iris-logreg",
        "parameters": {"rate_limit": RATE, "rate_limit_burst": BURST},
    }
    (repository / "iris-logreg" / "model-settings.json").write_text(json.dumps(settings))
    keys = root / "keys.txt"
    keys.write_text(KEYS)
    flags = ("--workers", "1", "--api-keys-file", str(keys), *SETUPS[request.param])
    with Server(repository, *flags) as running:
        running.wait_ready()
        yield running


def _post(server: Server, model: str, key: str = FREE) -> tuple[int, httpx.Response, float]:
    started = time.monotonic()
    reply = httpx.post(
        f"{server.url}/v2/models/{model}/infer",
        json=BODY,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    return reply.status_code, reply, time.monotonic() - started


def _burst(server: Server, model: str, count: int, key: str = FREE) -> tuple[list, float]:
    """``count`` requests at once from 16 clients; their answers and the seconds taken."""
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: _post(server, model, key), range(count)))
    return answers, time.monotonic() - started


def _refill(seconds: float) -> None:
    time.sleep(seconds)  # the bucket refills with time alone: nothing to poll


def test_a_burst_above_the_model_rate_gets_429_with_retry_after(server):
    _refill(BURST / RATE + 0.1)
    answers, elapsed = _burst(server, "iris-logreg", 24)
    passed = [reply for status, reply, _ in answers if status == 200]
    refused = [reply for status, reply, _ in answers if status == 429]
    assert len(passed) + len(refused) == len(answers), [a[0] for a in answers]
    # The bucket: its burst, plus what it gained meanwhile.
    assert 1 <= len(passed) <= BURST + math.ceil(RATE * elapsed) + 1
    assert refused
    for reply in refused:
        seconds = reply.headers["retry-after"]
        assert seconds.isdigit() and int(seconds) >= 1
        assert "rate limit" in reply.json()["error"] and "iris-logreg" in reply.json()["error"]


def test_requests_at_the_rate_all_pass(server):
    _refill(BURST / RATE + 0.1)
    statuses = []
    for _ in range(6):  # half the rate: one token every 2/RATE seconds
        started = time.monotonic()
        statuses.append(_post(server, "iris-logreg")[0])
        _refill(max(0.0, 2 / RATE - (time.monotonic() - started)))
    assert statuses == [200] * 6


def test_other_models_are_unaffected_by_a_limited_one(server):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        flood = pool.submit(_burst, server, "iris-logreg", 30)
        others = [_post(server, "iris-rf") for _ in range(10)]
        answers, _ = flood.result()
    assert any(status == 429 for status, _, _ in answers)
    assert [status for status, _, _ in others] == [200] * 10
    assert max(seconds for _, _, seconds in others) < 5  # generous: a loaded 2-core machine


def test_grpc_refusal_is_resource_exhausted_with_a_pushback(server):
    _refill(BURST / RATE + 0.1)
    metadata = (("authorization", f"Bearer {FREE}"),)
    request = infer_request("iris-logreg", x=X)
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        errors = []
        for _ in range(BURST + 6):
            try:
                stub.ModelInfer(request, metadata=metadata, timeout=30)
            except grpc.RpcError as exc:
                errors.append(exc)
        assert errors, "no call was refused"
        for error in errors:
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, error
            assert "rate limit" in error.details()
            trailing = dict(error.trailing_metadata())
            assert int(trailing["grpc-retry-pushback-ms"]) >= 1000
        # Another model on the same channel is not limited.
        reply = stub.ModelInfer(infer_request("iris-rf", x=X), metadata=metadata, timeout=30)
        assert isinstance(reply, pb.ModelInferResponse)


def test_an_api_key_rate_limits_its_own_calls_only(server):
    _refill(1.2)
    answers, elapsed = _burst(server, "iris-rf", 12, key=SLOW)
    statuses = [status for status, _, _ in answers]
    assert set(statuses) <= {200, 429}
    assert 1 <= statuses.count(200) <= 2 + math.ceil(2 * elapsed) + 1
    refused = next(reply for status, reply, _ in answers if status == 429)
    assert int(refused.headers["retry-after"]) >= 1
    assert "API key" in refused.json()["error"] and SLOW not in refused.text
    # The other key, on the same model at the same time, is not limited.
    assert [_post(server, "iris-rf", FREE)[0] for _ in range(5)] == [200] * 5
    metadata = (("authorization", f"Bearer {SLOW}"),)
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        codes = set()
        for _ in range(6):
            try:
                stub.ModelInfer(infer_request("iris-rf", x=X), metadata=metadata, timeout=30)
                codes.add(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.add(exc.code())
                pushback = dict(exc.trailing_metadata())["grpc-retry-pushback-ms"]
                assert int(pushback) >= 1000
        assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes, codes


def test_metrics_count_the_refusals(server):
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    limited = re.search(
        r'^inferpool_model_rate_limited_requests_total\{model="iris-logreg",version=""\} (\S+)$',
        text,
        re.M,
    )
    assert limited and float(limited.group(1)) >= 1, text[:2000]
    free = re.search(
        r'^inferpool_model_rate_limited_requests_total\{model="iris-rf",version=""\} (\S+)$',
        text,
        re.M,
    )
    assert free is None or float(free.group(1)) == 0
    for frontend in ("rest", "grpc"):
        keyed = re.search(
            rf'^inferpool_rejected_requests_total\{{frontend="{frontend}",'
            r'reason="api_key_rate_limit"\} (\S+)$',
            text,
            re.M,
        )
        assert keyed and float(keyed.group(1)) >= 1, frontend


def test_both_grpc_servers_read_the_priority_metadata(server):
    # Not a rate limit, but the one module serving both gRPC servers: each reads
    # inferpool-priority from the call's metadata (tests/e2e/test_priority.py orders by it).
    metadata = (("authorization", f"Bearer {FREE}"),)
    request = infer_request("iris-rf", x=X)
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        stub.ModelInfer(request, metadata=(*metadata, ("inferpool-priority", "2")), timeout=30)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, metadata=(*metadata, ("inferpool-priority", "x")), timeout=30)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "inferpool-priority must be a whole number" in refused.value.details()
