"""MLServer 1.7.1's documentation examples run unchanged (issue 38, point 10): the
repository of ``tests/mlserver/examples.py`` served by inferpool and by ``mlserver start``
side by side (one process each, holding every example's model), each example's request
sent to both over REST and gRPC, the answers compared: status, and each output's name,
datatype, shape and data.

Examples here: sklearn, xgboost, lightgbm (MLServer's own runtimes, installed by tox's
``mlserver`` environment), content-type (its request, and the same inputs typed by the
model's metadata) and custom-json. In a second repository, served by a second pair of
servers (``test_examples_second_installed.py``): mms and model-repository (the sklearn and
xgboost models again, under the same names and versions, laid out as those examples lay
them out), streaming (REST ``generate_stream`` and gRPC stream in, stream out with
MLServer's own client), mlflow (when ``mlserver-mlflow`` and the full ``mlflow`` package
are installed, as tox's ``mlserver`` environment does) and custom (numpyro: when numpyro
and jax are installed, which tox's ``mlserver`` environment leaves out, for time).

Not here: huggingface and cassava (hub downloads), kafka (a Kafka broker), alibi-detect
and alibi-explain (alibi is not installed), mllib (a Spark cluster), conda and tempo
(conda-pack and tempo, not installed), catboost (another module: the ``runtimes``
environment).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.mlserver.examples import write_examples
from tests.mlserver.runtimes import grpc_outputs, grpc_request
from tests.mlserver.test_mlmodel_installed import running_mlserver
from tests.support import Server


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("mlserver-examples")
    cases = write_examples(root)
    return root, {name: (path, body) for name, path, body in cases}


@pytest.fixture(scope="module")
def both(examples) -> Iterator[tuple[Server, tuple[str, str]]]:
    """inferpool and MLServer on the examples' repository, started together: inferpool
    loads its models while MLServer starts (each imports five libraries)."""
    with Server(examples[0], "--workers", "0") as ours, running_mlserver(examples[0]) as theirs:
        ours.wait_ready(timeout=300)  # generous: a loaded machine
        yield ours, theirs


@pytest.fixture(scope="module")
def inferpool(both) -> Server:
    return both[0]


@pytest.fixture(scope="module")
def mlserver(both) -> tuple[str, str]:
    """MLServer's REST URL and gRPC address."""
    return both[1]


NAMES = ["sklearn", "xgboost", "lightgbm", "content-type", "content-type-metadata", "custom-json"]


def assert_same_outputs(ours: list[dict], theirs: list[dict]) -> None:
    assert [o["name"] for o in ours] == [t["name"] for t in theirs]
    for one, other in zip(ours, theirs, strict=True):
        assert (one["name"], one["datatype"], one["shape"]) == (
            other["name"],
            other["datatype"],
            other["shape"],
        )
        if one["datatype"] in ("BYTES",):
            assert one["data"] == other["data"], one["name"]
        else:
            assert np.allclose(one["data"], other["data"], rtol=1e-6, atol=1e-7), one["name"]


@pytest.mark.parametrize("name", NAMES)
def test_rest_answers_as_mlserver(name: str, examples, inferpool: Server, mlserver) -> None:
    path, body = examples[1][name]
    ours = httpx.post(inferpool.url + path, json=body, timeout=60)
    theirs = httpx.post(mlserver[0] + path, json=body, timeout=60)
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    assert_same_outputs(ours.json()["outputs"], theirs.json()["outputs"])
    assert ours.json().get("model_version") == theirs.json().get("model_version")


def _grpc(address: str, path: str, body: dict) -> list[dict]:
    parts = path.split("/")
    request = grpc_request(parts[3], body)
    if "versions" in parts:
        request.model_version = parts[5]
    with grpc.insecure_channel(address) as channel:
        return grpc_outputs(GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60))


@pytest.mark.parametrize("name", NAMES)
def test_grpc_answers_as_mlserver(name: str, examples, inferpool: Server, mlserver) -> None:
    path, body = examples[1][name]
    assert_same_outputs(_grpc(inferpool.grpc_address, path, body), _grpc(mlserver[1], path, body))
