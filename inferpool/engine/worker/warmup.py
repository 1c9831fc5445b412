"""Warm-up: the requests of a model's ``warmup`` settings, run on a replica that has just
loaded, before it is READY.

Each sample becomes one REST JSON body (generated inputs, or a request file read from the
model's folder) that goes ``count`` times through the worker path (``path.run_group``), one
request at a time, so that decoding, codecs, predict and encoding all run once before the
first client's request does. A sample that is not answered 200 fails the load
(``ModelLoadError``); the timings of a replica's warm-up are one line of the load log.
Called by the worker after it loaded a model (or took the template's copy) and by the
in-process client after a load; never in the template process (docs/warmup.md).
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import numpy as np
import orjson

from inferpool.engine.ipc.messages import Kind, RequestHeader
from inferpool.engine.worker.model import LoadedModel
from inferpool.engine.worker.path import Job, run_group
from inferpool.errors import InferpoolError, ModelLoadError
from inferpool.protocol import limits
from inferpool.protocol.datatypes import NUMPY_BY_DATATYPE, admit
from inferpool.settings import WarmupInput, WarmupSample

logger = logging.getLogger(__name__)

# Every "random" input is drawn from this seed: the same values on every replica and load.
SEED = 0
# "random" integers stay small: they must fit every integer datatype and mean little to
# a model anyway.
_RANDOM_INTEGERS = 10


def warm_up(model: LoadedModel, where: str) -> None:
    """Run ``model``'s warm-up samples (nothing when it has none) and log their timings;
    ``where`` names the replica in the log line (``"in worker 1"``).

    Raises ``ModelLoadError("warm-up 'NAME' failed: reason")`` when a sample cannot be
    built or is not answered 200; the replica is then discarded, so its custom metrics
    are closed first.
    """
    samples = model.settings.warmup
    if not samples:
        return
    durations: list[int] = []
    started = time.perf_counter_ns()
    try:
        for sample in samples:
            body = _body(model, sample)
            durations.extend(_run(model, sample, body) for _ in range(sample.count))
    except ModelLoadError:
        model.runtime.metrics.close()
        raise
    elapsed = time.perf_counter_ns() - started
    version = model.settings.version
    label = f"model '{model.name}'" + (f" (version {version})" if version else "")
    logger.info(
        "%s: warm-up %s: %d samples, %d requests in %.1f ms "
        "(first %.1f ms, slowest %.1f ms, median %.1f ms)",
        label, where, len(samples), len(durations), elapsed / 1e6, durations[0] / 1e6,
        max(durations) / 1e6, statistics.median(durations) / 1e6,
    )  # fmt: skip


def _run(model: LoadedModel, sample: WarmupSample, body: bytes) -> int:
    """One request of ``sample`` through the worker path; its duration in ns."""
    started = time.perf_counter_ns()
    header = RequestHeader(0, 0, Kind.REST, None, 0, time.monotonic_ns(), len(body))
    reply = run_group(model, [Job(header, body)])[0]
    duration = time.perf_counter_ns() - started
    if reply.status != 200:
        reason = reply.body.decode("utf-8", "replace") or f"status {reply.status}"
        raise _failed(sample, reason)
    return duration


def _failed(sample: WarmupSample, reason: str) -> ModelLoadError:
    return ModelLoadError(f"warm-up '{sample.name}' failed: {reason}")


def _body(model: LoadedModel, sample: WarmupSample) -> bytes:
    """The REST JSON body of ``sample``."""
    if sample.request_file is not None:
        return _request_file(model, sample, sample.request_file)
    inputs = sample.inputs or _declared_inputs(model, sample)
    rng = np.random.default_rng(SEED)
    current = limits.current()
    spent = 0
    tensors = []
    for spec in inputs:
        shape = [
            (sample.batch_size if position == 0 else 1) if dim == -1 else dim
            for position, dim in enumerate(spec.shape)
        ]
        try:  # the server's limits, checked before anything is generated
            count, spent = admit(spec.name, spec.datatype, tuple(shape), spent, current)
        except InferpoolError as exc:
            raise _failed(sample, exc.message) from None
        tensor: dict[str, Any] = {
            "name": spec.name,
            "datatype": spec.datatype,
            "shape": shape,
            "data": _data(spec, count, rng),
        }
        if spec.parameters:
            tensor["parameters"] = spec.parameters
        tensors.append(tensor)
    return orjson.dumps({"inputs": tensors}, option=orjson.OPT_SERIALIZE_NUMPY)


def _declared_inputs(model: LoadedModel, sample: WarmupSample) -> list[WarmupInput]:
    """The model's inputs (its settings', or what its runtime derives) with zeros."""
    declared = model.metadata["inputs"]
    if not declared:
        raise _failed(
            sample,
            f"model '{model.name}' declares no inputs: give the sample's inputs or a request_file",
        )
    return [
        WarmupInput(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"], data="zero")
        for spec in declared
    ]


def _data(spec: WarmupInput, count: int, rng: np.random.Generator) -> Any:
    """The flat values of a generated input (or the explicit ones, as given)."""
    if isinstance(spec.data, list):
        return spec.data
    if spec.datatype == "BYTES":
        if spec.data == "zero":
            return [""] * count
        return [str(value) for value in rng.integers(0, 10**6, count)]
    dtype = NUMPY_BY_DATATYPE[spec.datatype]
    if spec.data == "zero":
        return _serialisable(np.zeros(count, dtype))
    if dtype.kind == "b":
        return rng.random(count) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0, _RANDOM_INTEGERS, count).astype(dtype)
    return _serialisable(rng.random(count).astype(dtype))


def _serialisable(values: np.ndarray) -> np.ndarray:
    """Float16 values as float32 (the same numbers in JSON): orjson 3.9.15, the oldest
    inferpool supports, cannot serialise a float16 array."""
    return values.astype(np.float32) if values.dtype == np.float16 else values


def _request_file(model: LoadedModel, sample: WarmupSample, name: str) -> bytes:
    """The file's bytes: inside the model's folder (symlinks resolved) and no larger than
    the server's body limit, checked before more than that is read."""
    folder = model.settings.folder
    if folder is None:
        raise _failed(sample, f"request_file {name!r} needs a model folder")
    root = folder.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise _failed(sample, f"request_file {name!r} is outside the model's folder")
    if not path.is_file():
        raise _failed(sample, f"request_file {name!r} is not a file in {folder}")
    most = limits.current().max_body_bytes
    try:
        with path.open("rb") as file:
            body = file.read(most + 1)
    except OSError as exc:
        raise _failed(sample, f"request_file {name!r} cannot be read: {exc}") from None
    if len(body) > most:
        raise _failed(
            sample,
            f"request_file {name!r} is over the limit of {most} bytes (max_body_bytes)",
        )
    return body
