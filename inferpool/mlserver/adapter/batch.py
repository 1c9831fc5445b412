"""Adaptive batching for MLServer custom runtimes, as MLServer 1.7.1 applies it
(``mlserver/batching``): the requests of one batch become one ``InferenceRequest`` for
the model's ``predict``, and its response is split back into one answer per request.

Joining (``merge_requests``): each input (by name, in the order first seen) concatenates
the requests' data along the first axis, its shape the first request's with the summed
first dimensions; its parameters merge, a key that several requests set becoming the list
of their values (``content_type`` and ``headers`` keep the last one). The request's
parameters merge with the later request winning, as do the requested outputs' (outputs
by name, none when no request named any). The joined request has no id.

Splitting (``split_answer``): each output is cut along its first axis by the rows each
request brought, its shape's first dimension set to them; an output parameter holding a
list (one value per row) gives each request the value at its first row, as text, the
others (``content_type``, ``headers``, any single value) go to every request as they are.
Every request gets the response's parameters; its id is its own (the engine answers with
the request's id). An output whose rows are not the batch's raises ``ValueError``: the
engine then predicts each request alone (``engine/worker/path.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from inferpool.protocol.types import InferenceRequest, RequestedOutput, Tensor
from inferpool.runtimes.base import Answer

# Parameters one value of which stands for the whole batch (MLServer's own exceptions).
_WHOLE = frozenset({"content_type", "headers"})


def merge_requests(requests: list[InferenceRequest]) -> tuple[InferenceRequest, list[int]]:
    """One request holding every request's rows, and the rows each brought (its first
    input's first dimension: MLServer assumes every input of a request has as many)."""
    parameters: dict[str, Any] = {}
    by_name: dict[str, list[Tensor]] = {}
    outputs: dict[str, dict[str, Any]] = {}
    for request in requests:
        parameters.update(request.parameters)
        for tensor in request.inputs:
            by_name.setdefault(tensor.name, []).append(tensor)
        for output in request.outputs:
            outputs.setdefault(output.name, {}).update(output.parameters)
    sizes = [_rows(request.inputs[0]) if request.inputs else 0 for request in requests]
    merged = InferenceRequest(
        inputs=[_merge_input(tensors) for tensors in by_name.values()],
        outputs=[RequestedOutput(name, given) for name, given in outputs.items()],
        parameters=parameters,
        # Strings read from JSON reach the model as str (as MLServer gives them), joined or not.
        json_strings=all(request.json_strings for request in requests),
    )
    return merged, sizes


def _rows(tensor: Tensor) -> int:
    return int(tensor.shape[0]) if tensor.shape else 1


def _merge_input(tensors: list[Tensor]) -> Tensor:
    first = tensors[0]
    rows = sum(_rows(tensor) for tensor in tensors)
    shape = (rows, *first.shape[1:])
    # A request whose other dimensions differ makes this raise: each then runs alone.
    data = np.concatenate([tensor.data.reshape(-1) for tensor in tensors]).reshape(shape)
    return Tensor(first.name, first.datatype, shape, data, _merge_input_parameters(tensors))


def _merge_input_parameters(tensors: list[Tensor]) -> dict[str, Any]:
    """Keys set by one tensor keep its value; keys set by several hold the list of their
    values, in order (``content_type``, ``headers``: the last one)."""
    seen: dict[str, list[Any]] = {}
    for tensor in tensors:
        for key, value in tensor.parameters.items():
            seen.setdefault(key, []).append(value)
    return {
        key: values[-1] if len(values) == 1 or key in _WHOLE else values
        for key, values in seen.items()
    }


def split_answer(answer: Mapping[str, Any], sizes: list[int]) -> list[dict[str, Any]]:
    """Each request's part of the joined request's answer (``MLModelRuntime.predict``'s:
    output tensors, and an ``Answer``'s response parameters)."""
    total = sum(sizes)
    bounds = np.cumsum([0, *sizes])
    parts: list[dict[str, Any]] = [{} for _ in sizes]
    for name, tensor in answer.items():
        if not tensor.shape or tensor.shape[0] != total:
            raise ValueError(f"output '{name}' has shape {list(tensor.shape)}, not {total} rows")
        for index, part in enumerate(parts):
            start, end = int(bounds[index]), int(bounds[index + 1])
            parameters = _part_parameters(tensor.parameters, start)
            shape = (end - start, *tensor.shape[1:])
            part[name] = Tensor(name, tensor.datatype, shape, tensor.data[start:end], parameters)
    if type(answer) is Answer:
        return [Answer(part, dict(answer.parameters)) for part in parts]
    return parts


def _part_parameters(parameters: dict[str, Any], first_row: int) -> dict[str, Any]:
    part = {}
    for key, value in parameters.items():
        if key in _WHOLE or not isinstance(value, list):
            part[key] = value
        elif first_row < len(value) and value[first_row] != []:
            part[key] = str(value[first_row])
    return part
