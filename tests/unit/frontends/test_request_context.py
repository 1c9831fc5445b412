"""The request id's pieces (``frontends/request_context.py``) and the frontends' calls to
the tracer, with a fake tracer: REST (the ASGI app), gRPC builtin and grpc.aio, served
in-process on 127.0.0.1 by the test's own loop (the real tracer: tests/unit/test_tracing.py
and tests/e2e/test_tracing.py)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from inferpool.engine.inprocess import InProcessClient
from inferpool.errors import BadRequest
from inferpool.frontends.grpc.aio import GrpcServer
from inferpool.frontends.grpc.h2 import GrpcH2Server
from inferpool.frontends.request_context import (
    checked,
    echoed_grpc_id,
    echoed_rest_id,
    from_header,
    from_metadata,
    generate,
)
from inferpool.frontends.rest.app import build_app, middleware
from inferpool.protocol import rest_json
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from inferpool.protocol.types import InferenceResponse, Tensor
from inferpool.settings import ServerSettings
from tests.support import build_iris_repository, free_port

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# -- ids ------------------------------------------------------------------------------------
def test_generated_ids_are_short_unique_and_new_after_a_fork():
    ids = {generate() for _ in range(1000)}
    assert len(ids) == 1000
    prefix = next(iter(ids)).split("-")[0]
    assert all(i.startswith(prefix + "-") and len(i) <= 16 for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports its first id and leaves at once
        os.write(write, generate().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    os.close(read)
    assert not child.startswith(prefix + "-")


@pytest.mark.parametrize("value", ["a", "req-42", "x" * 256, "0af7:6519/16cd=43dd+ x"])
def test_a_usable_id_is_taken_as_it_is(value):
    assert checked(value) == value
    assert from_header(value.encode()) == value
    assert from_metadata((("user-agent", "grpc"), ("x-request-id", value))) == value


@pytest.mark.parametrize("value", ["", "x" * 257, "tab\there", "é", "nul\x00"])
def test_an_unusable_id_is_refused(value):
    with pytest.raises(BadRequest, match="x-request-id must be 1 to 256 printable ASCII"):
        checked(value)


def test_no_id_given():
    assert from_header(None) is None
    assert from_metadata(()) is None
    assert from_metadata(None) is None


@pytest.mark.parametrize(
    ("model", "request_id"),
    [
        ("iris", "abc"),
        ('a "quoted" \\ model', 'an "id" with \\ and \\" inside'),
        ("m", "ünï 模型 🙂"),
        ("m", "\\"),
    ],
)
def test_the_rest_reply_echoes_the_id_as_the_worker_writes_it(model, request_id):
    output = Tensor("y", "INT64", [1], data=np.array([1]))
    response = InferenceResponse(model_name=model, outputs=[output], id=request_id)
    assert echoed_rest_id(rest_json.encode_response(response)) == request_id
    response.model_version = "2"
    assert echoed_rest_id(rest_json.encode_response(response)) == request_id


@pytest.mark.parametrize(
    "body",
    [b'{"error":"model \'x\' not found"}', b'{"model_name":"m","id":null}', b"", b"[1]", b'{"'],
)
def test_no_id_in_other_rest_bodies(body):
    assert echoed_rest_id(body) is None


def test_the_grpc_reply_echoes_the_id():
    response = pb.ModelInferResponse(model_name="m", model_version="2", id="the-id")
    response.outputs.add(name="y", datatype="INT64", shape=[1]).contents.int64_contents.append(1)
    response.raw_output_contents.append(b"\x01" * 200)
    assert echoed_grpc_id(response.SerializeToString()) == "the-id"
    long = pb.ModelInferResponse(model_name="m" * 200, model_version="v" * 130, id="i" * 256)
    assert echoed_grpc_id(long.SerializeToString()) == "i" * 256  # lengths over one byte
    assert echoed_grpc_id(pb.ModelInferResponse(model_name="m").SerializeToString()) is None
    assert echoed_grpc_id(b"\xff\xff") is None
    # A large custom runtime's answer arrives as a view of the reply (unwrap(view=True)).
    assert echoed_grpc_id(memoryview(response.SerializeToString())) == "the-id"
    assert echoed_grpc_id(memoryview(long.SerializeToString())) == "i" * 256


# -- the tracer hook -------------------------------------------------------------------------
class FakeTracer:
    """Records every ``finish`` call (the API of ``tracing.RequestTracer``)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def finish(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)

    def shutdown(self) -> None:
        pass


def test_nothing_is_added_to_the_rest_app_when_tracing_and_the_log_are_off():
    assert middleware(ServerSettings()) == []


BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64", "data": [1, 2, 3, 4]}]}


async def loaded_client(tmp_path: Path) -> InProcessClient:
    repository = build_iris_repository(tmp_path / "repo")
    client = InProcessClient(ServerSettings(model_repository=repository, workers=0))
    await client.start()
    return client


def test_rest_inferences_are_traced(tmp_path):
    tracer = FakeTracer()

    async def scenario() -> list[httpx.Response]:
        client = await loaded_client(tmp_path)
        app = build_app(client, tracer)
        transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 4567))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            before = time.time_ns()
            ok = await http.post(
                "/v2/models/iris-rf/infer",
                json={**BODY, "id": "rest-1"},
                headers={"traceparent": TRACEPARENT, "tracestate": "k=v"},
            )
            missing = await http.post("/v2/models/iris-rf/versions/3/infer", json=BODY)
            await http.get("/v2/health/ready")  # not an inference: no span
            assert before <= tracer.calls[0]["start_ns"] <= tracer.calls[0]["end_ns"]
        await client.close()
        return [ok, missing]

    ok, missing = asyncio.run(scenario())
    assert [call["code"] for call in tracer.calls] == [200, 404]
    first, second = tracer.calls
    assert first["protocol"] == "rest" and first["method"] == "POST"
    assert (first["model"], first["version"], first["peer"]) == ("iris-rf", None, "10.1.2.3:4567")
    assert (first["traceparent"], first["tracestate"]) == (TRACEPARENT, "k=v")
    assert first["request_id"] == ok.headers["x-request-id"] == "rest-1"
    assert first["reply"].rows == 1 and first["reply"].status == 200
    assert (second["model"], second["version"], second["reply"]) == ("iris-rf", "3", None)
    assert second["traceparent"] is None
    assert second["request_id"] == missing.headers["x-request-id"]


def pairs(metadata) -> dict:
    """grpc.aio metadata as a dict: iterating it gives (key, value) pairs on every grpcio,
    while ``dict(metadata)`` fails on grpcio 1.63 (its keys() are those pairs)."""
    return {key: value for key, value in metadata}


@pytest.mark.parametrize("implementation", ["builtin", "grpcio"])
def test_grpc_inferences_are_traced(tmp_path, implementation):
    tracer = FakeTracer()
    port = free_port()

    async def scenario() -> tuple[str, str]:
        client = await loaded_client(tmp_path)
        settings = ServerSettings(host="127.0.0.1", grpc_port=port, workers=0)
        if implementation == "builtin":
            server: Any = GrpcH2Server(client, settings, None, tracer)
        else:
            server = GrpcServer(client, settings, tracer=tracer)
        await server.start()
        request = pb.ModelInferRequest(model_name="iris-logreg")
        tensor = request.inputs.add(name="x", datatype="FP64", shape=[1, 4])
        tensor.contents.fp64_contents.extend([1, 2, 3, 4])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = GRPCInferenceServiceStub(channel)
                call = stub.ModelInfer(request, metadata=(("traceparent", TRACEPARENT),))
                await call
                ok_id = pairs(await call.trailing_metadata())["x-request-id"]
                request.model_name = "nope"
                call = stub.ModelInfer(request)
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await call
                failed_id = pairs(failed.value.trailing_metadata())["x-request-id"]
                await stub.ServerReady(pb.ServerReadyRequest())  # not an inference: no span
        finally:
            await server.stop()
            await client.close()
        return ok_id, failed_id

    ok_id, failed_id = asyncio.run(scenario())
    assert [call["code"] for call in tracer.calls] == [200, 404]
    first, second = tracer.calls
    assert first["protocol"] == "grpc"
    assert first["method"] == "/inference.GRPCInferenceService/ModelInfer"
    assert (first["model"], first["version"]) == ("iris-logreg", None)
    assert first["traceparent"] == TRACEPARENT and first["tracestate"] is None
    assert first["peer"].startswith("127.0.0.1:")
    assert first["request_id"] == ok_id
    assert first["reply"].rows == 1 and first["error"] is None
    assert first["start_ns"] <= first["end_ns"]
    assert (second["model"], second["reply"], second["request_id"]) == ("nope", None, failed_id)
    assert second["error"] == "model 'nope' not found"
