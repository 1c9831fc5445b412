"""gRPC server reflection (``grpc.reflection.v1`` and ``v1alpha``) for both gRPC servers.

``grpcurl``, Postman and ``ProtoReflectionDescriptorDatabase`` ask a server which services
it has and for the ``.proto`` files (as serialized FileDescriptorProtos) that describe them,
then build every message from those descriptors alone. The answers come from the
``grpcio-reflection`` package's servicer, over a descriptor pool of the files the server
serves (``reflection_pool``): the V2 service (``grpc_predict_v2.proto``), inferpool's own
services (``inferpool_ext.proto``), MLServer's model-repository service
(``model_repository.proto``), ``grpc.health.v1`` and the reflection service itself;
each file is answered with the files it imports. A symbol or file the pool does not hold
is an ``error_response`` NOT_FOUND, as are extensions (these protos declare none), and the
stream goes on.

The package serves ``v1alpha`` only; ``v1`` has the same messages with the same field
numbers in another package, so both services take the same messages here and the v1
file is derived from the v1alpha one (``_v1_file``). grpc.aio gets the package's servicer
as is (``aio_handlers``); the builtin HTTP/2 layer runs each request of the stream through
the same servicer (``ReflectionStream``), so both servers answer byte for byte alike.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message import DecodeError
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.reflection import ReflectionServicer
from grpc_reflection.v1alpha.reflection import aio as reflection_aio

from inferpool.frontends.grpc.custom import CUSTOM_SERVICE, FEEDBACK_SERVICE
from inferpool.frontends.grpc.h2_call import CallError
from inferpool.frontends.grpc.health import HEALTH_SERVICE
from inferpool.frontends.grpc.model_repository import REPOSITORY_SERVICE
from inferpool.frontends.grpc.service import SERVICE
from inferpool.protocol.generated import (
    grpc_predict_v2_pb2,
    health_pb2,
    inferpool_ext_pb2,
    model_repository_pb2,
)

V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
V1 = "grpc.reflection.v1.ServerReflection"
METHOD = "ServerReflectionInfo"
PATHS = frozenset(f"/{service}/{METHOD}".encode() for service in (V1, V1ALPHA))
_MALFORMED = "cannot parse the ServerReflectionRequest"
SERVICES = (
    SERVICE,
    CUSTOM_SERVICE,
    FEEDBACK_SERVICE,
    REPOSITORY_SERVICE,
    HEALTH_SERVICE,
    V1,
    V1ALPHA,
)


def _file_proto(descriptor: Any) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    descriptor.CopyToProto(proto)
    return proto


def _v1_file(v1alpha: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """``grpc/reflection/v1/reflection.proto``: the v1alpha file in the v1 package (the
    messages and their field numbers are the same in both)."""
    v1 = descriptor_pb2.FileDescriptorProto()
    v1.CopyFrom(v1alpha)
    v1.name = "grpc/reflection/v1/reflection.proto"
    v1.package = "grpc.reflection.v1"
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    for message in v1.message_type:
        for field in message.field:
            if field.type_name:  # set only for message and enum fields
                field.type_name = field.type_name.replace(old, new)
    for service in v1.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    v1.options.Clear()  # v1alpha's Java/C# package options name v1alpha
    return v1


@functools.cache
def reflection_pool() -> descriptor_pool.DescriptorPool:
    """The files reflection describes, in a pool of their own (dependencies first)."""
    pool = descriptor_pool.DescriptorPool()
    v1alpha = _file_proto(reflection_pb2.DESCRIPTOR)
    files = [
        _file_proto(grpc_predict_v2_pb2.DESCRIPTOR),
        _file_proto(inferpool_ext_pb2.DESCRIPTOR),
        _file_proto(model_repository_pb2.DESCRIPTOR),
        _file_proto(health_pb2.DESCRIPTOR),
        v1alpha,
        _v1_file(v1alpha),
    ]
    for proto in files:
        pool.Add(proto)
    return pool


def servicer() -> ReflectionServicer:
    """grpcio-reflection's servicer over the server's services and files."""
    return ReflectionServicer(SERVICES, pool=reflection_pool())


def aio_handlers() -> list[grpc.GenericRpcHandler]:
    """The generic handlers serving both reflection services on grpc.aio. The requests
    are parsed here rather than by grpc.aio, which logs a traceback and ends the call
    UNKNOWN for a message it cannot parse: INTERNAL with a message instead."""
    answering = reflection_aio.ReflectionServicer(SERVICES, pool=reflection_pool())

    async def info(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async def parsed() -> AsyncIterator[Any]:
            async for data in requests:
                try:
                    yield reflection_pb2.ServerReflectionRequest.FromString(data)
                except DecodeError:
                    await context.abort(grpc.StatusCode.INTERNAL, _MALFORMED)

        async for response in answering.ServerReflectionInfo(parsed(), context):
            yield response

    method = grpc.stream_stream_rpc_method_handler(
        info, response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString
    )
    return [grpc.method_handlers_generic_handler(name, {METHOD: method}) for name in (V1, V1ALPHA)]


class ReflectionStream:
    """ServerReflectionInfo on the builtin HTTP/2 layer: ``stream_infer`` has the shape
    ``h2_stream.serve_stream`` drives (request bytes in, response bytes out)."""

    def __init__(self) -> None:
        self.servicer = servicer()

    def answer(self, data: bytes) -> bytes:
        """One request's response; a message that is not a ServerReflectionRequest ends
        the call with INTERNAL, as on grpc.aio (``aio_handlers``)."""
        try:
            request = reflection_pb2.ServerReflectionRequest.FromString(data)
        except DecodeError:
            raise CallError("INTERNAL", _MALFORMED) from None
        response = next(self.servicer.ServerReflectionInfo(iter((request,)), None))
        data_out: bytes = response.SerializeToString()
        return data_out

    async def stream_infer(
        self, requests: AsyncIterator[bytes], deadline: float | None, metadata: Any = ()
    ) -> AsyncIterator[bytes]:
        # No API key asked (``metadata`` unread): the descriptors are the public protocol's,
        # and name no model.
        async for data in requests:
            yield self.answer(data)
