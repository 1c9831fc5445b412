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
and jax are installed, as tox's ``mlserver`` environment does).

Not here: huggingface and cassava (hub downloads), kafka (a Kafka broker), alibi-detect
and alibi-explain (alibi is not installed), mllib (a Spark cluster), conda and tempo
(conda-pack and tempo, not installed), catboost (CatBoost is not installed in this
environment).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mlserver.examples import write_examples
from tests.mlserver.side_by_side import (
    assert_rest_same,
    grpc_infer,
    side_by_side,
)
from tests.support import Server
from tests.support.same_outputs import assert_same_outputs


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("mlserver-examples")
    cases = write_examples(root)
    return root, {name: (path, body) for name, path, body in cases}


@pytest.fixture(scope="module")
def both(examples) -> Iterator[tuple[Server, tuple[str, str]]]:
    """inferpool and MLServer (its REST URL and gRPC address) on the examples'
    repository."""
    with side_by_side(examples[0], "--workers", "0") as pair:
        yield pair


NAMES = ["sklearn", "xgboost", "lightgbm", "content-type", "content-type-metadata", "custom-json"]


@pytest.mark.parametrize("name", NAMES)
def test_rest_answers_as_mlserver(name: str, examples, both) -> None:
    path, body = examples[1][name]
    assert_rest_same(both[0].url, both[1][0], path, body)


@pytest.mark.parametrize("name", NAMES)
def test_grpc_answers_as_mlserver(name: str, examples, both) -> None:
    path, body = examples[1][name]
    ours, theirs = both[0].grpc_address, both[1][1]
    assert_same_outputs(grpc_infer(ours, path, body), grpc_infer(theirs, path, body), atol=1e-7)
