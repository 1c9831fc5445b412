"""gRPC server reflection (grpc.reflection.v1 and v1alpha) on both gRPC servers, with
grpcio-reflection's client (``ProtoReflectionDescriptorDatabase``) and raw stubs: the
services listed, inference.GRPCInferenceService described, calls built from the reflected
descriptors alone (ServerLive, ModelInfer), the errors the specification asks for, a
malformed request, an idle reflection stream beside other calls, and reflection off."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.support import Server, build_iris_repository, iris_data
from tests.support.grpc import IMPLEMENTATIONS

TIMEOUT = 20.0
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
V1 = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
V1ALPHA = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
Request = reflection_pb2.ServerReflectionRequest
Response = reflection_pb2.ServerReflectionResponse


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def server(request, tmp_path_factory) -> Iterator[Server]:
    repository = build_iris_repository(tmp_path_factory.mktemp("models"))
    args = ("--workers", "0", "--grpc-implementation", request.param)
    with Server(repository, *args) as running:
        running.wait_ready()
        yield running


@pytest.fixture
def channel(server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_address) as open_channel:
        yield open_channel


def reflect(channel: grpc.Channel, path: str, *requests: Request) -> list[Response]:
    """One reflection stream sending ``requests``: the responses, in order."""
    call = channel.stream_stream(
        path,
        request_serializer=Request.SerializeToString,
        response_deserializer=Response.FromString,
    )
    return list(call(iter(requests), timeout=TIMEOUT))


@pytest.mark.parametrize("path", [V1, V1ALPHA], ids=["v1", "v1alpha"])
def test_list_services_on_both_versions(channel, path) -> None:
    (response,) = reflect(channel, path, Request(list_services=""))
    names = {service.name for service in response.list_services_response.service}
    assert {
        "inference.GRPCInferenceService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
        "inferpool.CustomService",
        "inference.model_repository.ModelRepositoryService",
    } <= names
    assert response.original_request.HasField("list_services")


def test_every_listed_service_is_described(channel) -> None:
    """grpcurl's ``describe``: each listed service resolves from the reflected files."""
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    database = ProtoReflectionDescriptorDatabase(channel)
    for name in database.get_services():
        assert pool.FindServiceByName(name).methods, name
    service = pool.FindServiceByName("inference.GRPCInferenceService")
    methods = {method.name: method for method in service.methods}
    assert {"ServerLive", "ModelInfer", "ModelStreamInfer", "TraceSetting"} <= set(methods)
    assert methods["ModelInfer"].input_type.full_name == "inference.ModelInferRequest"
    repository = pool.FindServiceByName("inference.model_repository.ModelRepositoryService")
    load = repository.methods_by_name["RepositoryModelLoad"]
    assert load.input_type.full_name == "inference.model_repository.RepositoryModelLoadRequest"
    v1 = pool.FindServiceByName("grpc.reflection.v1.ServerReflection")
    method = v1.methods_by_name["ServerReflectionInfo"]
    assert method.input_type.full_name == "grpc.reflection.v1.ServerReflectionRequest"


def dynamic_call(channel: grpc.Channel, pool, method: str, **fields) -> object:
    """A unary call whose messages come from the reflected descriptors only."""
    service = pool.FindServiceByName("inference.GRPCInferenceService")
    descriptor = service.methods_by_name[method]
    request_class = message_factory.GetMessageClass(descriptor.input_type)
    response_class = message_factory.GetMessageClass(descriptor.output_type)
    call = channel.unary_unary(
        f"/inference.GRPCInferenceService/{method}",
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    return call(request_class(**fields), timeout=TIMEOUT)


def test_calls_built_from_reflected_descriptors(channel) -> None:
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    assert dynamic_call(channel, pool, "ServerLive").live is True
    X, _ = iris_data()
    rows = X[:3]
    tensor = {
        "name": "input-0",
        "datatype": "FP64",
        "shape": list(rows.shape),
        "contents": {"fp64_contents": rows.ravel().tolist()},
    }
    reply = dynamic_call(channel, pool, "ModelInfer", model_name="iris-logreg", inputs=[tensor])
    assert reply.model_name == "iris-logreg"
    output = reply.outputs[0]
    assert output.shape[0] == 3
    dtypes = {"INT64": "<i8", "FP64": "<f8", "FP32": "<f4", "INT32": "<i4"}
    if reply.raw_output_contents:
        values = np.frombuffer(reply.raw_output_contents[0], dtypes[output.datatype])
    else:
        values = np.asarray(getattr(output.contents, output.contents.ListFields()[0][0].name))
    # The first iris rows are setosa (class 0): labels 0, or probabilities led by class 0.
    if output.datatype.startswith("INT"):
        assert values.tolist() == [0, 0, 0]
    else:
        assert np.allclose(values.reshape(3, -1).sum(axis=1), 1.0)
        assert values.reshape(3, -1).argmax(axis=1).tolist() == [0, 0, 0]


def test_files_come_with_their_dependencies(channel) -> None:
    responses = reflect(
        channel,
        V1,
        Request(file_by_filename="inferpool_ext.proto"),
        Request(file_containing_symbol="inference.ModelInferRequest.InferInputTensor"),
        Request(file_containing_symbol="grpc.health.v1.Health"),
    )
    names = []
    for response in responses:
        files = response.file_descriptor_response.file_descriptor_proto
        names.append({descriptor_pb2.FileDescriptorProto.FromString(f).name for f in files})
    assert names == [
        {"inferpool_ext.proto", "grpc_predict_v2.proto"},
        {"grpc_predict_v2.proto"},
        {"health.proto"},
    ]


def test_unknown_names_and_extensions_are_not_found_and_the_stream_goes_on(channel) -> None:
    extension = reflection_pb2.ExtensionRequest(
        containing_type="inference.ModelInferRequest", extension_number=100
    )
    responses = reflect(
        channel,
        V1ALPHA,
        Request(file_containing_symbol="no.such.Symbol"),
        Request(file_by_filename="no/such.proto"),
        Request(file_containing_extension=extension),
        Request(all_extension_numbers_of_type="no.such.Type"),
        Request(all_extension_numbers_of_type="inference.ModelInferRequest"),
        Request(list_services=""),
    )
    assert [r.error_response.error_code for r in responses[:4]] == [NOT_FOUND] * 4
    assert responses[1].original_request.file_by_filename == "no/such.proto"
    numbers = responses[4].all_extension_numbers_response
    assert numbers.base_type_name == "inference.ModelInferRequest"
    assert list(numbers.extension_number) == []
    assert responses[5].list_services_response.service


def test_a_request_with_no_question_is_invalid_argument(channel) -> None:
    (response,) = reflect(channel, V1, Request(host="x"))
    assert response.error_response.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_a_malformed_request_ends_the_call_and_the_server_serves_on(server, channel) -> None:
    call = channel.stream_stream(V1)  # raw bytes: no serializers
    with pytest.raises(grpc.RpcError) as caught:
        list(call(iter([b"\x0a\xff\xff\xff\xff\x0f"]), timeout=TIMEOUT))
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "cannot parse the ServerReflectionRequest" in caught.value.details()
    (response,) = reflect(channel, V1, Request(list_services=""))
    assert response.list_services_response.service
    assert "Traceback" not in server.output()


def test_an_idle_reflection_stream_does_not_hold_other_calls_up(server, channel) -> None:
    """A stream opened and never written to: live checks and other reflection streams go
    on as fast as without it, and the idle stream still answers when it speaks."""
    from queue import Queue

    queue: Queue[Request | None] = Queue()
    idle = channel.stream_stream(
        V1,
        request_serializer=Request.SerializeToString,
        response_deserializer=Response.FromString,
    )(iter(queue.get, None), timeout=TIMEOUT * 3)
    time.sleep(0.2)  # the idle call is open on the server
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    with grpc.insecure_channel(server.grpc_address) as other:
        for _ in range(20):
            started = time.perf_counter()
            assert dynamic_call(other, pool, "ServerLive").live
            (answer,) = reflect(other, V1ALPHA, Request(list_services=""))
            assert answer.list_services_response.service
            assert time.perf_counter() - started < 2.0  # generous: a loaded machine
    queue.put(Request(list_services=""))
    assert next(idle).list_services_response.service
    queue.put(None)
    assert list(idle) == []


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_reflection_off(tmp_path, implementation) -> None:
    args = ("--workers", "0", "--grpc-implementation", implementation, "--no-grpc-reflection")
    with Server(tmp_path, *args) as running:
        running.wait_live()
        with grpc.insecure_channel(running.grpc_address) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                reflect(channel, V1, Request(list_services=""))
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
