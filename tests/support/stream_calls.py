"""A gRPC ModelStreamInfer call driven one request at a time (``Conversation``): the
client sends a request only when it decides to, so a test can prove that a server
answered one request before the next existed. Shared by tests/e2e/test_stream_input.py
and tests/mlserver (the same conversation with MLServer itself)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb

STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"


def stream_method(channel: grpc.Channel, message: Any = pb.ModelInferResponse) -> Any:
    """ModelStreamInfer on ``channel``, its responses parsed as ``message``."""
    return channel.stream_stream(
        STREAM_METHOD,
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=message.FromString,
    )


def typed_request(model: str, values: list[float], request_id: str = "") -> pb.ModelInferRequest:
    """A request as MLServer's converters make it: typed FP64 contents."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    tensor = request.inputs.add(name="x", datatype="FP64", shape=[len(values)])
    tensor.contents.fp64_contents.extend(values)
    return request


class Conversation:
    """A ModelStreamInfer call driven one request at a time: ``send`` puts a request on
    the wire, ``receive`` waits for the next response; the client's stream ends at
    ``close``."""

    def __init__(
        self,
        address: str,
        message: Any = pb.ModelInferResponse,
        channel: grpc.Channel | None = None,
        metadata: Any = None,
    ) -> None:
        """``channel``: one of the caller's (TLS), else an insecure one to ``address``."""
        self._outgoing: queue.Queue = queue.Queue()
        self.channel = channel or grpc.insecure_channel(address)
        method = stream_method(self.channel, message)
        self.call = method(self._requests(), timeout=60, metadata=metadata)
        self.sent = 0

    def _requests(self) -> Iterator[pb.ModelInferRequest]:
        while (request := self._outgoing.get()) is not None:
            yield request

    def send(self, request: pb.ModelInferRequest) -> None:
        self.sent += 1
        self._outgoing.put(request)

    def receive(self):
        return next(self.call)

    def close(self) -> list:
        """End the client's stream; the responses that still come."""
        self._outgoing.put(None)
        try:
            return list(self.call)
        finally:
            self.channel.close()


def totals(response: pb.ModelInferResponse) -> list[float]:
    (output,) = response.outputs
    if output.contents.fp64_contents:
        return list(output.contents.fp64_contents)
    return np.frombuffer(response.raw_output_contents[0], dtype="<f8").tolist()
