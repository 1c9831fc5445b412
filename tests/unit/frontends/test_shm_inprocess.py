"""System shared memory with ``--workers 0``: the request is resolved in the server's own
process (the in-process path decodes it there), and unregistering unmaps it there."""

from __future__ import annotations

import _posixshmem
import asyncio
import contextlib
import mmap
import os
import uuid

import numpy as np

from inferpool.engine.inprocess import InProcessClient
from inferpool.engine.worker import shm_regions
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.grpc.service import InferenceService
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.settings import ServerSettings
from tests.support import iris_data, write_sklearn_model

ROWS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]])


def _object(size: int) -> str:
    key = f"/inferpool-inproc-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = _posixshmem.shm_open(key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, size)
    with mmap.mmap(fd, size) as view:
        view[: ROWS.nbytes] = ROWS.astype("<f8").tobytes()
    os.close(fd)
    return key


def _request() -> bytes:
    request = pb.ModelInferRequest(model_name="iris-logreg")
    tensor = request.inputs.add(name="input-0", datatype="FP64", shape=[2, 4])
    tensor.parameters["shared_memory_region"].string_param = "in"
    tensor.parameters["shared_memory_byte_size"].int64_param = ROWS.nbytes
    output = request.outputs.add(name="predict")
    output.parameters["shared_memory_region"].string_param = "in"
    output.parameters["shared_memory_byte_size"].int64_param = 16
    output.parameters["shared_memory_offset"].int64_param = ROWS.nbytes
    return request.SerializeToString()


def test_a_request_is_resolved_and_unmapped_in_process(tmp_path):
    key = _object(ROWS.nbytes + 16)

    async def scenario() -> tuple[int, bytes, list[int], list[int]]:
        from sklearn.linear_model import LogisticRegression

        write_sklearn_model(
            tmp_path / "iris-logreg", LogisticRegression(max_iter=1000).fit(*iris_data())
        )
        settings = ServerSettings(model_repository=tmp_path, load_probe=False)
        client = InProcessClient(settings)
        await client.start()
        try:
            service = InferenceService(DataPlane(client))
            register = pb.SystemSharedMemoryRegisterRequest(
                name="in", key=key, byte_size=ROWS.nbytes + 16
            )
            await service.shared_memory.register(register, None)
            reply = await service.infer(_request(), None)
            mapped = shm_regions.mapped()
            await service.shared_memory.unregister(pb.SystemSharedMemoryUnregisterRequest(), None)
            return reply.status, reply.body, mapped, shm_regions.mapped()
        finally:
            await client.close()

    try:
        status, body, mapped, after = asyncio.run(scenario())
        fd = _posixshmem.shm_open(key, os.O_RDONLY, 0)
        with mmap.mmap(fd, ROWS.nbytes + 16, prot=mmap.PROT_READ) as view:
            written = np.frombuffer(view[ROWS.nbytes :], dtype="<i8").tolist()
        os.close(fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink(key)
    assert status == 200, body
    assert written == [0, 2]
    (output,) = pb.ModelInferResponse.FromString(body).outputs
    assert output.parameters["shared_memory_byte_size"].int64_param == 16
    assert len(mapped) == len(after) + 1  # mapped here, and dropped on unregister
