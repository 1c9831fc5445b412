"""Triton's model configuration extension: a served model's ``ModelConfig`` in its JSON form.

``GET /v2/models/{name}[/versions/{v}]/config`` answers it as JSON and gRPC ``ModelConfig``
as the message of the same fields; clients such as ``perf_analyzer`` read it before they
send a request. The configuration is derived, never configured: names, datatypes and shapes
from the model's V2 metadata, batching from its settings.

Classical models take rows: when every tensor's first dimension is variable (``-1``), that
dimension is Triton's batch dimension. ``max_batch_size`` is then the most rows a request
may hold (the server's ``max_tensor_elements`` over the widest input's elements per row)
and ``dims`` leave the batch dimension out; a per-row scalar (shape ``[-1]``) is Triton's
``dims: [1]`` reshaped to ``[]``. Otherwise ``max_batch_size`` is 0 and ``dims`` are the
whole shape. ``dynamic_batching`` is present when the model batches requests
(``max_batch_size`` > 1 in its settings).

``version_policy`` is the policy that chose the model's versions (``all`` without one), in
Triton's shape: a specific policy's versions are numbers where they are numbers. Triton's
gRPC ``ModelConfig`` holds numbers only: there (``numbers_only``) the versions that are not
numbers (MLServer's ``v1``) are left out.
"""

from __future__ import annotations

import math
from typing import Any

from inferpool.engine.client import EngineClient
from inferpool.settings import VersionPolicy

# Triton's ModelConfig caps max_batch_size at int32.
_MAX_INT32 = 2**31 - 1


def model_config(
    client: EngineClient, name: str, version: str | None, numbers_only: bool = False
) -> dict[str, Any]:
    """The ModelConfig of a listed model (ModelNotFound for an unknown name or version)."""
    status = client.table.find(name, version)
    metadata = status.metadata
    inputs = metadata.get("inputs") or []
    outputs = metadata.get("outputs") or []
    batched = bool(inputs) and all(_has_batch_dimension(spec) for spec in (*inputs, *outputs))
    max_rows = _max_rows(inputs, client.settings.max_tensor_elements) if batched else 0
    settings = status.settings
    policy = settings.version_policy if settings is not None else None
    config: dict[str, Any] = {
        "name": status.name,
        "platform": metadata.get("platform", ""),
        "backend": "inferpool",
        "version_policy": _version_policy(policy, numbers_only),
        "max_batch_size": max_rows,
        "input": [_tensor(spec, batched) for spec in inputs],
        "output": [_tensor(spec, batched) for spec in outputs],
    }
    if settings is not None and settings.max_batch_size > 1:
        delay = round(settings.max_batch_time * 1_000_000)
        config["dynamic_batching"] = {"max_queue_delay_microseconds": delay}
    return config


def _version_policy(policy: VersionPolicy | None, numbers_only: bool) -> dict[str, Any]:
    if policy is None or policy.all is not None:
        return {"all": {}}
    if policy.latest is not None:
        return {"latest": {"num_versions": policy.latest.num_versions}}
    assert policy.specific is not None
    versions: list[int | str] = []
    for version in policy.specific.versions:
        if version.isascii() and version.isdigit():
            versions.append(int(version))
        elif not numbers_only:
            versions.append(version)
    return {"specific": {"versions": versions}}


def _has_batch_dimension(spec: dict[str, Any]) -> bool:
    shape = spec.get("shape") or []
    return len(shape) >= 1 and shape[0] == -1


def _max_rows(inputs: list[dict[str, Any]], max_elements: int) -> int:
    widest: int = max(math.prod(max(1, int(d)) for d in spec["shape"][1:]) for spec in inputs)
    return max(1, min(_MAX_INT32, max_elements // widest))


def _tensor(spec: dict[str, Any], batched: bool) -> dict[str, Any]:
    shape = list(spec.get("shape") or [])
    dims = shape[1:] if batched else shape
    tensor: dict[str, Any] = {
        "name": spec["name"],
        "data_type": _data_type(spec.get("datatype", "")),
        "dims": dims or [1],
    }
    if not dims:  # one value per row (or a scalar): Triton's [1] reshaped to []
        tensor["reshape"] = {"shape": []}
    return tensor


def _data_type(datatype: str) -> str:
    """Triton's DataType name of a V2 datatype (BYTES is Triton's TYPE_STRING)."""
    if datatype == "BYTES":
        return "TYPE_STRING"
    return f"TYPE_{datatype}" if datatype else "TYPE_INVALID"
