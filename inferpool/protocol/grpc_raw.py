"""A typed request to ModelInferRequest bytes with raw contents, and a ModelInferResponse's
bytes back to a typed response: how the engine itself calls a model through the workers.

The embedded API (``engine/embedded.py``) and the steps of a pipeline
(``engine/pipelines``) hand typed tensors to a model that may run in a worker, so they
cross the process boundary in the gRPC format with raw contents: each tensor's own bytes,
no per-element encoding, which every worker already decodes, and which it answers in.
"""

from __future__ import annotations

import numpy as np
from google.protobuf.message import DecodeError

from inferpool.errors import InferpoolError
from inferpool.protocol.binary import tensor_from_bytes
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.grpc_wire import (
    parameters_dict,
    raw_bytes,
    response_of,
    set_parameters,
    typed_data,
)
from inferpool.protocol.types import InferenceRequest, InferenceResponse, Tensor


def to_wire(request: InferenceRequest) -> bytes:
    """A serialized ``ModelInferRequest`` carrying every input as raw contents."""
    message = pb.ModelInferRequest(id=request.id or "")
    set_parameters(message.parameters, request.parameters)
    for tensor in request.inputs:
        entry = message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        set_parameters(entry.parameters, tensor.parameters)
        message.raw_input_contents.append(raw_bytes(tensor))
    for output in request.outputs:
        requested = message.outputs.add(name=output.name)
        set_parameters(requested.parameters, output.parameters)
    body: bytes = message.SerializeToString()
    return body


def from_wire(body: bytes, writable: bool = True) -> InferenceResponse:
    """The response to a ``to_wire`` request (a model answers raw, as it was asked; typed
    contents are read too). ``writable``: arrays the caller may write to (raw outputs are
    otherwise read-only views of the message's bytes)."""
    try:
        message = pb.ModelInferResponse.FromString(body)
    except DecodeError:
        raise InferpoolError("a model's reply is not a valid ModelInferResponse") from None
    raw = message.raw_output_contents
    outputs = []
    for index, tensor in enumerate(message.outputs):
        shape = tuple(tensor.shape)
        if raw:
            data = tensor_from_bytes(memoryview(raw[index]), tensor.datatype, shape, tensor.name)
            if writable and isinstance(data, np.ndarray) and not data.flags.writeable:
                data = data.copy()
        else:
            data = typed_data(tensor.contents, tensor.datatype, shape, tensor.name)
            shape = data.shape  # loose BYTES keep their own (typed_data)
        outputs.append(
            Tensor(tensor.name, tensor.datatype, shape, data, parameters_dict(tensor.parameters))
        )
    return response_of(message, outputs)
