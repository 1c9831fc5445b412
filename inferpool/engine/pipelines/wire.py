"""A step's call in the wire form the workers exchange: a ModelInferRequest with raw
contents out, the ModelInferResponse's raw outputs back.

Raw contents keep a tensor's bytes as they are (no JSON numbers, no typed lists): a
step's outputs become the next step's inputs by reference, decoded once into zero-copy
numpy views.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.message import DecodeError

from inferpool.errors import InferpoolError
from inferpool.protocol.binary import tensor_from_bytes
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.grpc_wire import (
    parameters_dict,
    raw_bytes,
    set_parameters,
    typed_data,
)
from inferpool.protocol.types import Tensor


def request_bytes(
    model: str,
    version: str | None,
    inputs: list[Tensor],
    outputs: list[str] | None,
    parameters: Mapping[str, Any],
) -> bytes:
    """A serialized ModelInferRequest for a child model, its inputs as raw contents."""
    message = pb.ModelInferRequest(model_name=model, model_version=version or "")
    set_parameters(message.parameters, parameters)
    for tensor in inputs:
        added = message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        set_parameters(added.parameters, tensor.parameters)
        message.raw_input_contents.append(raw_bytes(tensor))
    for name in outputs or ():
        message.outputs.add(name=name)
    body: bytes = message.SerializeToString()
    return body


def response_tensors(body: bytes) -> list[Tensor]:
    """The outputs of a child's serialized ModelInferResponse (raw or typed contents)."""
    try:
        message = pb.ModelInferResponse.FromString(body)
    except DecodeError:
        raise InferpoolError("a step's reply is not a valid ModelInferResponse") from None
    raw = message.raw_output_contents
    tensors = []
    for index, output in enumerate(message.outputs):
        shape = tuple(output.shape)
        if raw:
            data = tensor_from_bytes(raw[index], output.datatype, shape, output.name)
        else:
            data = typed_data(output.contents, output.datatype, shape, output.name)
        tensors.append(
            Tensor(output.name, output.datatype, shape, data, parameters_dict(output.parameters))
        )
    return tensors
