"""The gRPC frontend's own logic: routing from raw bytes, deadlines, error mapping."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from inferpool.engine.inprocess import InProcessClient
from inferpool.engine.shared_memory import SharedMemoryRegistry
from inferpool.engine.states import ModelStatus, ModelTable
from inferpool.errors import BadRequest, DeadlineExceeded, Overloaded
from inferpool.frontends.access_log import model_in_path
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.grpc.aio import guarded
from inferpool.frontends.grpc.observer import CallObserver
from inferpool.frontends.grpc.service import InferenceService, model_of, read_route
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.settings import ServerSettings
from tests.support.grpc import build_grpc_repository


def request_bytes(**fields) -> bytes:
    request = pb.ModelInferRequest(**fields)
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    request.raw_input_contents.append(b"\x00" * 300)  # a long field to skip
    request.parameters["p"].int64_param = -5  # a nested varint
    return request.SerializeToString()


def test_read_route_finds_name_and_version():
    assert read_route(request_bytes(model_name="iris", model_version="3")) == ("iris", "3")
    assert read_route(request_bytes(model_name="iris")) == ("iris", None)


def test_read_route_in_any_field_order_and_last_one_wins():
    tail = pb.ModelInferRequest(model_name="second", id="r").SerializeToString()
    body = request_bytes(model_name="first") + tail
    assert read_route(body) == ("second", None)
    reordered = request_bytes(id="abc") + pb.ModelInferRequest(model_name="m").SerializeToString()
    assert read_route(reordered) == ("m", None)


@pytest.mark.parametrize(
    "body",
    [
        b"\x0a\x05ab",  # a string longer than the body
        b"\x0a",  # a key with no value
        b"\x0f\x00",  # wire type 7 does not exist
        b"\x00\x00",  # field number 0
        b"\x0a\x02\xff\xfe",  # a name that is not UTF-8
        b"\x10" + b"\xff" * 11,  # a varint that never ends
    ],
)
def test_read_route_refuses_malformed_bytes(body):
    with pytest.raises(BadRequest, match=r"not a valid inference\.ModelInferRequest"):
        read_route(body)


def test_read_route_needs_a_model_name():
    with pytest.raises(BadRequest, match="no model_name"):
        read_route(request_bytes(id="x"))


class Context:
    """The part of grpc.aio.ServicerContext the service uses."""

    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining
        self.aborted: tuple[grpc.StatusCode, str] | None = None
        self.trailers: tuple = ()

    def time_remaining(self) -> float | None:
        return self.remaining

    def invocation_metadata(self) -> tuple:
        return ()

    def set_trailing_metadata(self, trailers: tuple) -> None:
        self.trailers = trailers

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError()


async def loaded_client(repository: Path) -> InProcessClient:
    client = InProcessClient(ServerSettings(model_repository=repository))
    await client.start()
    return client


def mark_request(mark: Path) -> bytes:
    request = pb.ModelInferRequest(model_name="echo")
    tensor = request.inputs.add(name="mark", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(str(mark).encode())
    return request.SerializeToString()


def test_a_passed_deadline_is_not_run_and_is_deadline_exceeded(tmp_path):
    repository = build_grpc_repository(tmp_path / "repo")
    mark = tmp_path / "ran"

    async def scenario() -> Context:
        service = InferenceService(DataPlane(await loaded_client(repository)))
        context = Context(remaining=-0.01)
        with pytest.raises(grpc.aio.AbortError):
            await guarded("ModelInfer", service.model_infer, CallObserver(False))(
                mark_request(mark), context
            )
        return context

    context = asyncio.run(scenario())
    assert context.aborted is not None
    assert context.aborted[0] is grpc.StatusCode.DEADLINE_EXCEEDED
    assert not mark.exists()


def test_the_deadline_reaches_the_engine():
    seen: list[float | None] = []

    class Recorder:
        table = ModelTable()  # the service asks whether the model is a user's runtime
        table.set(ModelStatus("m", None))
        shared_memory = SharedMemoryRegistry(lambda serials: None, 0)  # no region

        async def infer(self, name, version, kind, body, json_length, deadline=None):
            seen.append(deadline)
            raise DeadlineExceeded("late")

    service = InferenceService(DataPlane(Recorder()))  # type: ignore[arg-type]
    body = request_bytes(model_name="m")
    for remaining in (2.0, None):
        with pytest.raises(DeadlineExceeded):
            asyncio.run(service.model_infer(body, Context(remaining)))
    assert seen[0] is not None and 1.5 < seen[0] - time.monotonic() <= 2.0
    assert seen[1] is None


def test_an_unexpected_error_is_internal_not_a_traceback():
    async def broken(request, context):
        raise RuntimeError("boom")

    context = Context(None)
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(
            guarded("ServerLive", broken, CallObserver(False))(pb.ServerLiveRequest(), context)
        )
    assert context.aborted == (grpc.StatusCode.INTERNAL, "internal error: RuntimeError: boom")


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("/v2/models/iris/infer", "iris"),
        ("/v2/models/iris/versions/2/infer", "iris"),
        ("/v2/models/iris", "iris"),
        ("/v2/repository/models/iris/load", "iris"),
        ("/v2/models/stats", "-"),
        ("/v2/models/statsmodel/infer", "statsmodel"),
        ("/v2/health/live", "-"),
    ],
)
def test_the_access_log_names_the_model_of_a_rest_path(path, model):
    assert model_in_path(path) == model


def test_the_access_log_names_the_model_of_an_rpc():
    assert model_of(request_bytes(model_name="iris")) == "iris"
    assert model_of(b"\x0f") == "-"
    assert model_of(pb.ModelMetadataRequest(name="rf")) == "rf"
    assert model_of(pb.RepositoryModelLoadRequest(model_name="lgb")) == "lgb"
    assert model_of(pb.ServerLiveRequest()) == "-"


def test_overloaded_is_unavailable_with_a_retry_pushback():
    async def full(request, context):
        raise Overloaded("every queue for model 'm' is full")

    context = Context(None)
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(guarded("ModelInfer", full, CallObserver(False))(b"", context))
    assert context.aborted == (grpc.StatusCode.UNAVAILABLE, "every queue for model 'm' is full")
    assert context.trailers[1:] == (("grpc-retry-pushback-ms", "1000"),)  # after x-request-id
