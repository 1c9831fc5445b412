"""The wire format of ``Kind.REST_SHM`` / ``Kind.GRPC_SHM``: a request body (of the kind
the table names) behind the table of registered shared-memory regions
(``engine/ipc/shared_memory.py``). Decoding reads each input that names a region out of
its mapping (``shm_regions``) and checks each requested output's region; encoding writes
those outputs into their regions and answers them with their datatype, shape and
parameters, without data, as Triton does. Every bound is checked before any access: the
region is registered, the tensor's part lies inside it, and an input's size is its
datatype's times its shape's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from inferpool.engine.ipc.shared_memory import Region, unwrap
from inferpool.engine.worker import shm_regions
from inferpool.engine.worker.wire_formats import wire_format
from inferpool.errors import BadRequest
from inferpool.protocol.binary import tensor_from_bytes, tensor_to_bytes
from inferpool.protocol.datatypes import NUMPY_BY_DATATYPE, element_count
from inferpool.protocol.shared_memory import (
    BYTE_SIZE,
    OFFSET,
    REGION,
    TensorRegion,
    resolving,
    tensor_region,
)
from inferpool.protocol.types import InferenceRequest, InferenceResponse, Tensor


@dataclass(slots=True)
class ShmRequest(InferenceRequest):
    """A request whose tensors may be in regions: its body's kind, and where each output
    the request wants in a region goes (``raw_contents``: as a gRPC request has it)."""

    inner_kind: int = 0
    targets: dict[str, tuple[Region, TensorRegion]] = field(default_factory=dict)
    raw_contents: bool = False


def decode(body: bytes, json_length: int | None) -> InferenceRequest:
    table, inner = unwrap(body)
    with resolving():
        request = wire_format(table.kind).decode(inner, json_length)
    regions = table.regions
    for tensor in request.inputs:
        if REGION in tensor.parameters:
            where = tensor_region(tensor.parameters, tensor.name, "input")
            region = _located(regions, where, tensor.name, "input")
            _check_input_size(tensor, where)
            raw = shm_regions.read(where.region, region, where.offset, where.byte_size)
            tensor.data = tensor_from_bytes(raw, tensor.datatype, tensor.shape, tensor.name)
    targets = {}
    for output in request.outputs:
        if REGION in output.parameters:
            where = tensor_region(output.parameters, output.name, "output")
            targets[output.name] = (_located(regions, where, output.name, "output"), where)
    return ShmRequest(
        inputs=request.inputs,
        id=request.id,
        outputs=request.outputs,
        parameters=request.parameters,
        json_strings=request.json_strings,
        inner_kind=table.kind,
        targets=targets,
        raw_contents=getattr(request, "raw_contents", False),
    )


def encode(response: InferenceResponse, request: InferenceRequest) -> tuple[bytes, int | None]:
    assert isinstance(request, ShmRequest)  # decode made it
    if request.targets:
        response.outputs = [_written(output, request.targets) for output in response.outputs]
    return wire_format(request.inner_kind).encode(response, request)


def _located(regions: dict[str, Region], where: TensorRegion, name: str, what: str) -> Region:
    """The registered region ``where`` names, once its part is known to lie inside."""
    region = regions.get(where.region)
    if region is None:
        raise BadRequest(
            f"{what} '{name}' names shared memory region '{where.region}', which is not registered"
        )
    if where.offset + where.byte_size > region.byte_size:
        raise BadRequest(
            f"{what} '{name}': offset {where.offset} + byte size {where.byte_size} runs past "
            f"shared memory region '{where.region}' ({region.byte_size} bytes)"
        )
    return region


def _check_input_size(tensor: Tensor, where: TensorRegion) -> None:
    if tensor.datatype == "BYTES":
        return  # length-prefixed elements: tensor_from_bytes checks them
    needed = element_count(tensor.shape) * NUMPY_BY_DATATYPE[tensor.datatype].itemsize
    if where.byte_size != needed:
        raise BadRequest(
            f"input '{tensor.name}': shape {list(tensor.shape)} of {tensor.datatype} needs "
            f"{needed} bytes, but its shared memory byte size is {where.byte_size}"
        )


def _written(output: Tensor, targets: dict[str, tuple[Region, TensorRegion]]) -> Tensor:
    """``output`` written into its region, as the answer shows it (no data); or itself."""
    target = targets.get(output.name)
    if target is None:
        return output
    region, where = target
    raw = tensor_to_bytes(output)
    if len(raw) > where.byte_size:
        raise BadRequest(
            f"output '{output.name}' needs {len(raw)} bytes, but its shared memory byte "
            f"size is {where.byte_size}"
        )
    shm_regions.write(where.region, region, where.offset, raw)
    parameters = {**output.parameters, REGION: where.region, BYTE_SIZE: len(raw)}
    if where.offset:
        parameters[OFFSET] = where.offset
    return Tensor(output.name, output.datatype, output.shape, np.empty(0), parameters)
