"""Helpers for the gRPC tests: worker counts, datatype samples, a test repository, stubs."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.support import Server, build_iris_repository
from tests.support.runtimes import write_echo_model

needs_pool = pytest.mark.skipif(
    importlib.util.find_spec("inferpool.engine.pool.pool") is None,
    reason="inferpool.engine.pool.pool (the worker pool) is not in this build",
)
# Every e2e test runs in-process (0) and with a worker pool (2) once the pool exists.
WORKER_COUNTS = [0, pytest.param(2, marks=needs_pool)]


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda w: f"w{w}")
def models_server(request, models) -> Iterator[Server]:
    """A server of the module's ``models`` fixture (its repository first), with 0 and 2
    workers; a module takes it as its ``server`` with ``server = models_server``."""
    with Server(models[0], "--workers", str(request.param)) as running:
        running.wait_ready()
        yield running


# Both gRPC implementations (``--grpc-implementation``) serve the same service.
IMPLEMENTATIONS = ["builtin", "grpcio"]
# (workers, implementation): every combination of the two lists above.
SETUPS = [
    pytest.param((workers, implementation), id=f"{implementation}-w{workers}", marks=marks)
    for implementation in IMPLEMENTATIONS
    for workers, marks in ((0, ()), (2, needs_pool))
]

# One sample per V2 datatype, with the extremes of each range.
SAMPLES = {
    "BOOL": np.array([[True, False], [False, True]]),
    "UINT8": np.array([[0, 255], [1, 254]], np.uint8),
    "UINT16": np.array([[0, 65535], [1, 2]], np.uint16),
    "UINT32": np.array([[0, 2**32 - 1], [1, 2]], np.uint32),
    "UINT64": np.array([[0, 2**64 - 1], [1, 2]], np.uint64),
    "INT8": np.array([[-128, 127], [0, -1]], np.int8),
    "INT16": np.array([[-(2**15), 2**15 - 1], [0, -1]], np.int16),
    "INT32": np.array([[-(2**31), 2**31 - 1], [0, -1]], np.int32),
    "INT64": np.array([[-(2**63), 2**63 - 1], [0, -1]], np.int64),
    "FP16": np.array([[1.5, -2.25], [65504.0, 0.0]], np.float16),
    "FP32": np.array([[1.5, -2.25], [3.4e38, 1e-7]], np.float32),
    "FP64": np.array([[1.5, -2.25], [1.7e308, 5e-324]], np.float64),
    "BYTES": np.array([[b"hello", b""], ["héllo".encode(), b"\x00\xff"]], dtype=object),
}
# The typed contents field of each datatype, as the specification assigns them (FP16 has
# no field of its own; it travels in fp32_contents, as MLServer does).
TYPED_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP16": "fp32_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def build_grpc_repository(root: Path) -> Path:
    """The iris models plus ``echo``: the echo runtime with outputs ``a`` and ``b``, so
    every datatype can travel both ways (and the hook inputs mark, sleep and fail)."""
    build_iris_repository(root)
    outputs = [{"name": name, "datatype": "BYTES", "shape": [-1]} for name in ("a", "b")]
    write_echo_model(root, "echo", outputs)
    return root


@contextmanager
def running_server(
    repository: Path, workers: int, *args: str, implementation: str = "builtin"
) -> Iterator[Server]:
    flags = ("--workers", str(workers), "--grpc-implementation", implementation)
    with Server(repository, *flags, *args) as server:
        server.wait_ready()
        yield server


@contextmanager
def workers_server(repository: Path, workers: int, timeout: float = 120) -> Iterator[Server]:
    """A ready server of ``repository`` with ``workers`` workers (a ``WORKER_COUNTS``
    entry, ``request.param`` of a module's fixture), which it carries as ``workers``."""
    with Server(repository, "--workers", str(workers)) as server:
        server.wait_ready(timeout=timeout)
        server.workers = workers  # type: ignore[attr-defined]
        yield server


@contextmanager
def setup_server(setup: tuple[int, str], root: Path) -> Iterator[Server]:
    """A server on a new test repository in ``root`` for one ``SETUPS`` entry; it carries
    ``repository`` and ``workers`` for the tests."""
    workers, implementation = setup
    repository = build_grpc_repository(root)
    with running_server(repository, workers, implementation=implementation) as server:
        server.repository = repository
        server.workers = workers
        yield server


@contextmanager
def stub_for(server: Server) -> Iterator[GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_address) as channel:
        yield GRPCInferenceServiceStub(channel)


def infer_request(model: str, **tensors) -> pb.ModelInferRequest:
    """A request with typed FP64 inputs, e.g. ``infer_request("iris-rf", x=array)``."""
    request = pb.ModelInferRequest(model_name=model)
    for name, array in tensors.items():
        tensor = request.inputs.add(name=name, datatype="FP64", shape=array.shape)
        tensor.contents.fp64_contents.extend(array.ravel().tolist())
    return request
