"""kserve's own clients (InferenceRESTClient with the v2 protocol, InferenceGRPCClient),
installed beside inferpool by tox's ``clients`` environment, against live servers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import joblib
import numpy as np
import pytest
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

from tests.support import Server, iris_data

MODEL = "iris-rf"


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    X, _ = iris_data()
    return X[::11]


@pytest.fixture(scope="module")
def estimator(clients_repository: Path):
    return joblib.load(clients_repository / MODEL / "model.joblib")


def iris_request(rows: np.ndarray, binary: bool) -> InferRequest:
    tensor = InferInput("input-0", list(rows.shape), "FP64")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    return InferRequest(model_name=MODEL, infer_inputs=[tensor])


def outputs_of(response) -> dict[str, np.ndarray]:
    return {output.name: output.as_numpy() for output in response.outputs}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_rest_infer(clients_server: Server, estimator, rows, binary: bool) -> None:
    async def infer():
        client = InferenceRESTClient(RESTConfig(protocol="v2"))
        try:
            return await client.infer(clients_server.url, iris_request(rows, binary), MODEL)
        finally:
            await client.close()

    response = asyncio.run(infer())

    assert response.model_name == MODEL
    assert np.array_equal(outputs_of(response)["predict"], estimator.predict(rows))


def test_rest_health(clients_server: Server) -> None:
    async def health():
        client = InferenceRESTClient(RESTConfig(protocol="v2"))
        try:
            return (
                await client.is_server_live(clients_server.url),
                await client.is_server_ready(clients_server.url),
                await client.is_model_ready(clients_server.url, MODEL),
                await client.is_model_ready(clients_server.url, "no-such-model"),
            )
        finally:
            await client.close()

    assert asyncio.run(health()) == (True, True, True, False)


def test_grpc_infer(clients_server: Server, estimator, rows) -> None:
    async def infer():
        async with InferenceGRPCClient(clients_server.grpc_address) as client:
            return await client.infer(iris_request(rows, binary=True))

    response = asyncio.run(infer())

    assert response.model_name == MODEL
    outputs = outputs_of(response)
    assert np.array_equal(outputs["predict"], estimator.predict(rows))


def test_grpc_health(clients_server: Server) -> None:
    async def health():
        async with InferenceGRPCClient(clients_server.grpc_address) as client:
            return (
                await client.is_server_live(),
                await client.is_server_ready(),
                await client.is_model_ready(MODEL),
            )

    assert asyncio.run(health()) == (True, True, True)
