"""kserve's own clients (InferenceRESTClient with the v2 and v1 protocols, InferenceGRPCClient),
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


# -- KServe's V1 protocol (REST only) --------------------------------------------------------
def test_rest_v1_predict_and_explain(clients_server: Server, estimator, rows) -> None:
    """InferenceRESTClient with ``protocol="v1"``: ``infer`` posts ``:predict`` and
    ``explain`` ``:explain``, both answered as KServe's sklearnserver answers."""

    async def calls():
        client = InferenceRESTClient(RESTConfig(protocol="v1"))
        try:
            body = {"instances": rows.tolist()}
            predicted = await client.infer(clients_server.url, body, MODEL)
            explained = await client.explain(clients_server.url, MODEL, body)
            return predicted, explained
        finally:
            await client.close()

    predicted, explained = asyncio.run(calls())

    assert predicted == {"predictions": estimator.predict(rows).tolist()}
    contributions = np.asarray(explained["explanations"]["contributions"])
    np.testing.assert_allclose(contributions.sum(axis=-1), estimator.predict_proba(rows), atol=1e-9)


def test_rest_v1_health(clients_server: Server) -> None:
    """``is_server_live`` reads ``GET /``, ``is_model_ready`` ``GET /v1/models/{name}``; an
    unknown model is KServe's 404, which the client raises."""
    import httpx

    async def health():
        client = InferenceRESTClient(RESTConfig(protocol="v1"))
        try:
            live = await client.is_server_live(clients_server.url)
            ready = await client.is_model_ready(clients_server.url, MODEL)
            with pytest.raises(httpx.HTTPStatusError) as unknown:
                await client.is_model_ready(clients_server.url, "no-such-model")
            return live, ready, unknown.value.response
        finally:
            await client.close()

    live, ready, unknown = asyncio.run(health())

    assert (live, ready) == (True, True)
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "Model with name no-such-model does not exist."}


def test_rest_v1_bad_instances(clients_server: Server) -> None:
    import httpx

    async def infer():
        client = InferenceRESTClient(RESTConfig(protocol="v1"))
        try:
            with pytest.raises(httpx.HTTPStatusError) as refused:
                await client.infer(clients_server.url, {"instances": [[1.0, 2.0]]}, MODEL)
            return refused.value.response
        finally:
            await client.close()

    refused = asyncio.run(infer())

    assert refused.status_code == 400
    assert "expects 4 values per instance" in refused.json()["error"]
