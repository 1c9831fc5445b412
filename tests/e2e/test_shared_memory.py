"""Triton's system shared-memory extension end to end, with tritonclient's shared-memory
utilities and its HTTP and gRPC clients: registration over REST and both gRPC servers,
inference whose inputs and outputs are in regions (read and written by the worker, which
maps each region once), and the faults a client can cause (bounds, missing or truncated
objects, unlinked ones). Every fault test checks that the server keeps serving.

One server per gRPC implementation (module-scoped); REST runs on the builtin one's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.support import Server, build_iris_repository
from tests.support.code_blocks import blocks, on_ports
from tests.support.grpc import IMPLEMENTATIONS, needs_pool
from tests.support.runtimes import write_echo_model

# tritonclient's shared_memory imports pkg_resources (setuptools<81: tox.ini), which appends
# setuptools' vendored packages to sys.path: every test module collected in this process
# would then see them installed (tests/unit/engine/environments compares what this process
# reads with what a fresh interpreter reads). Its import is done: the entry goes.
sys.path[:] = [
    entry for entry in sys.path if not entry.endswith(os.path.join("setuptools", "_vendor"))
]

pytestmark = needs_pool

IRIS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]])


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def server(request, tmp_path_factory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("shm")
    build_iris_repository(root)
    write_echo_model(root, "echo", inputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 3]}])
    flags = ("--workers", "1", "--grpc-implementation", request.param)
    with Server(root, *flags) as server:
        server.wait_ready()
        server.implementation = request.param
        yield server


@pytest.fixture(scope="module")
def clients(server) -> Iterator[list[tuple[object, object]]]:
    """(client, module) per protocol this server's run covers: REST on the builtin run."""
    grpc_client = tgrpc.InferenceServerClient(server.grpc_address)
    pairs: list[tuple[object, object]] = [(grpc_client, tgrpc)]
    http_client = None
    if server.implementation == "builtin":
        http_client = thttp.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        pairs.insert(0, (http_client, thttp))
    yield pairs
    grpc_client.close()
    if http_client is not None:
        http_client.close()


class Regions:
    """Shared-memory objects a test creates (unique keys), destroyed at its end."""

    def __init__(self) -> None:
        self.handles: dict[str, object] = {}

    def create(self, size: int) -> tuple[str, object]:
        key = f"/inferpool-test-{os.getpid()}-{uuid.uuid4().hex[:10]}"
        handle = shm.create_shared_memory_region(key[1:], key, size)
        self.handles[key] = handle
        return key, handle

    def close(self) -> None:
        for handle in self.handles.values():
            with contextlib.suppress(shm.SharedMemoryException):  # a test unlinked it
                shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions(clients) -> Iterator[Regions]:
    made = Regions()
    yield made
    clients[0][0].unregister_system_shared_memory()
    made.close()


def iris_regions(clients, regions: Regions) -> tuple[tuple[str, object], tuple[str, object]]:
    """Regions "in" (holding IRIS) and "out", 64 bytes each, registered: (key, handle) each."""
    created = regions.create(64), regions.create(64)
    shm.set_shared_memory_region(created[0][1], [IRIS])
    for region, (key, _) in zip(("in", "out"), created, strict=True):
        clients[0][0].register_system_shared_memory(region, key, 64)
    return created


def name() -> str:
    return f"r-{uuid.uuid4().hex[:8]}"


def iris_infer(client, module, input_region: str, output_region: str, **sizes) -> object:
    x = module.InferInput("input-0", [2, 4], "FP64")
    x.set_shared_memory(input_region, sizes.get("in_size", 64), offset=sizes.get("in_offset", 0))
    out = module.InferRequestedOutput("predict_proba")
    out.set_shared_memory(output_region, sizes.get("out_size", 48))
    return client.infer("iris-logreg", [x], outputs=[out])


def plain_proba(client, module) -> np.ndarray:
    x = module.InferInput("input-0", [2, 4], "FP64")
    x.set_data_from_numpy(IRIS)
    out = module.InferRequestedOutput("predict_proba")
    return client.infer("iris-logreg", [x], outputs=[out]).as_numpy("predict_proba")


def assert_serving(clients) -> None:
    """The server still answers plain requests over every protocol of the run."""
    for client, module in clients:
        proba = plain_proba(client, module)
        assert proba.shape == (2, 3)
        assert np.allclose(proba.sum(axis=1), 1)


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return str(caught.value)


def mapped_by_workers(server: Server, key: str) -> dict[int, int]:
    """pid → lines of /proc/PID/maps naming ``key``, over the server's processes."""
    found = {}
    for process in psutil.Process(server.process.pid).children(recursive=True):
        try:
            lines = Path(f"/proc/{process.pid}/maps").read_text().splitlines()
        except OSError:
            continue
        count = sum(
            1 for line in lines if line.endswith(f"/dev/shm{key}") or f"/dev/shm{key} " in line
        )
        if count:
            found[process.pid] = count
    return found


def wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# -- the extension's calls ---------------------------------------------------------------
def test_extension_is_listed(server, clients):
    for client, module in clients:
        metadata = client.get_server_metadata()
        extensions = metadata["extensions"] if module is thttp else metadata.extensions
        assert "system_shared_memory" in extensions


def test_register_status_unregister(clients, regions):
    key, _ = regions.create(128)
    for client, module in clients:
        first, second = name(), name()
        client.register_system_shared_memory(first, key, 64)
        client.register_system_shared_memory(second, key, 32, offset=64)
        status = client.get_system_shared_memory_status()
        if module is tgrpc:
            listed = {n: (r.key, r.offset, r.byte_size) for n, r in status.regions.items()}
        else:
            listed = {r["name"]: (r["key"], r["offset"], r["byte_size"]) for r in status}
        assert listed == {first: (key, 0, 64), second: (key, 64, 32)}
        one = client.get_system_shared_memory_status(region_name=second)
        assert (len(one.regions) if module is tgrpc else len(one)) == 1
        message = refused(client.register_system_shared_memory, first, key, 8)
        assert f"shared memory region '{first}' is already registered" in message
        client.unregister_system_shared_memory(first)
        client.unregister_system_shared_memory(first)  # again: no error, as Triton
        message = refused(client.get_system_shared_memory_status, region_name=first)
        assert f"shared memory region '{first}' is not registered" in message
        client.unregister_system_shared_memory()
        status = client.get_system_shared_memory_status()
        assert not (status.regions if module is tgrpc else status)


def test_cuda_shared_memory_is_refused_naming_system_memory(clients):
    for client, module in clients:
        message = refused(client.get_cuda_shared_memory_status)
        assert "CUDA shared memory is not supported" in message
        assert "only system shared memory" in message
        expected = "StatusCode.UNIMPLEMENTED" if module is tgrpc else "[400]"
        assert expected in message


# -- inference through regions -----------------------------------------------------------
def test_inputs_and_outputs_in_regions(server, clients, regions):
    (in_key, _), (_, out_handle) = iris_regions(clients, regions)
    client0 = clients[0][0]
    for client, module in clients:
        expected = plain_proba(client, module)
        shm.set_shared_memory_region(out_handle, [np.zeros(8)])
        result = iris_infer(client, module, "in", "out")
        answered = result.get_output("predict_proba")
        if module is tgrpc:
            parameters = {
                k: v.int64_param or v.string_param for k, v in answered.parameters.items()
            }
            shape = list(answered.shape)
        else:
            parameters, shape = answered["parameters"], answered["shape"]
            assert "data" not in answered
        assert shape == [2, 3]
        assert parameters["shared_memory_region"] == "out"
        assert parameters["shared_memory_byte_size"] == 48
        written = shm.get_contents_as_numpy(out_handle, np.float64, [2, 3])
        assert np.allclose(written, expected)
    # The worker mapped each region once, however many requests used it.
    mapped = mapped_by_workers(server, in_key)
    assert len(mapped) == 1, mapped
    # ... and the frontend never mapped it: the tensor bytes did not pass through it.
    assert in_key not in Path(f"/proc/{server.process.pid}/maps").read_text()
    # Unregistering unmaps it in the worker.
    client0.unregister_system_shared_memory()
    wait_for(lambda: not mapped_by_workers(server, in_key))


def test_a_custom_runtime_reads_and_writes_at_offsets(clients, regions):
    key, handle = regions.create(256)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    shm.set_shared_memory_region(handle, [x], offset=40)
    clients[0][0].register_system_shared_memory("area", key, 200, offset=16)
    for client, module in clients:
        tensor = module.InferInput("x", [2, 3], "FP32")
        tensor.set_shared_memory("area", 24, offset=24)  # object byte 40
        out = module.InferRequestedOutput("x")
        out.set_shared_memory("area", 24, offset=100)  # object byte 116
        client.infer("echo", [tensor], outputs=[out])
        assert np.array_equal(shm.get_contents_as_numpy(handle, np.float32, [2, 3], offset=116), x)


# -- faults --------------------------------------------------------------------------------
def test_bounds_and_sizes_are_checked_before_any_access(clients, regions):
    key, handle = regions.create(64)
    shm.set_shared_memory_region(handle, [IRIS])
    clients[0][0].register_system_shared_memory("in", key, 64)
    clients[0][0].register_system_shared_memory("small", key, 16)
    for client, module in clients:
        message = refused(iris_infer, client, module, "in", "in", in_offset=8)
        assert "offset 8 + byte size 64 runs past shared memory region 'in' (64 bytes)" in message
        message = refused(iris_infer, client, module, "in", "in", in_size=56)
        assert "needs 64 bytes, but its shared memory byte size is 56" in message
        message = refused(iris_infer, client, module, "nowhere", "in")
        assert "names shared memory region 'nowhere', which is not registered" in message
        message = refused(iris_infer, client, module, "in", "small", out_size=16)
        assert (
            "output 'predict_proba' needs 48 bytes, but its shared memory byte size is 16"
            in message
        )
        message = refused(iris_infer, client, module, "in", "small", out_size=48)
        assert "runs past shared memory region 'small' (16 bytes)" in message
        code = "StatusCode.INVALID_ARGUMENT" if module is tgrpc else "[400]"
        assert code in message
    assert_serving(clients)


def test_registrations_that_cannot_hold_are_refused(clients, regions):
    key, _ = regions.create(64)
    for client, module in clients:
        # None registered yet: the request goes without a table, and is refused as well.
        message = refused(iris_infer, client, module, "ghost", "ghost")
        assert "names shared memory region 'ghost', which is not registered" in message
        message = refused(client.register_system_shared_memory, name(), "/no-such-object-here", 8)
        assert "shared memory object '/no-such-object-here' does not exist" in message
        message = refused(client.register_system_shared_memory, name(), key, 2**62)
        assert f"runs past the end of object '{key}' (64 bytes)" in message
        message = refused(client.register_system_shared_memory, name(), key, 8, offset=60)
        assert "offset 60 + byte_size 8 runs past the end" in message
    assert_serving(clients)


def test_an_unlinked_region_stays_valid_while_registered(clients, regions):
    (in_key, _), _ = iris_regions(clients, regions)
    for client, module in clients:
        iris_infer(client, module, "in", "out")  # mapped now
    os.unlink(f"/dev/shm{in_key}")
    for client, module in clients:
        iris_infer(client, module, "in", "out")  # the worker's mapping keeps it alive
        message = refused(client.register_system_shared_memory, name(), in_key, 64)
        assert f"shared memory object '{in_key}' does not exist" in message
    assert_serving(clients)


def test_a_truncated_region_is_refused_and_the_worker_survives(server, clients, regions):
    (in_key, in_handle), (out_key, _) = iris_regions(clients, regions)
    client0 = clients[0][0]
    for client, module in clients:
        iris_infer(client, module, "in", "out")  # mapped now: a later read would SIGBUS
    workers = set(mapped_by_workers(server, in_key))
    os.truncate(f"/dev/shm{in_key}", 8)
    os.truncate(f"/dev/shm{out_key}", 8)
    for client, module in clients:
        message = refused(iris_infer, client, module, "in", "out")
        truncated = f"region 'in' was truncated under the server: its object '{in_key}' has 8"
        assert truncated in message
    # Registered, then truncated before any worker mapped it: refused at the mapping.
    late_key, _ = regions.create(64)
    client0.register_system_shared_memory("late", late_key, 64)
    os.truncate(f"/dev/shm{late_key}", 0)
    for client, module in clients:
        message = refused(iris_infer, client, module, "late", "out")
        assert (
            f"shared memory region 'late' ends at byte 64, but its object '{late_key}' has 0 bytes"
            in message
        )
    # Grown back: served again, by the same worker (it never died).
    os.truncate(f"/dev/shm{in_key}", 64)
    os.truncate(f"/dev/shm{out_key}", 64)
    shm.set_shared_memory_region(in_handle, [IRIS])
    for client, module in clients:
        iris_infer(client, module, "in", "out")
    assert set(mapped_by_workers(server, in_key)) == workers
    assert_serving(clients)


def test_the_documented_example_runs(server, tmp_path):
    """docs/shared-memory.md's example, on this server's ports, prints what it says."""
    if server.implementation != "builtin":
        pytest.skip("the page's example runs once")
    page = Path(__file__).resolve().parents[2] / "docs" / "shared-memory.md"
    (block,) = [b for b in blocks(page.read_text(), "shared-memory.md") if b.language == "python"]
    unique = f"/doc-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    code = on_ports(block.code, server).replace('"/my-', f'"{unique}-')
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[0", "2]"]
