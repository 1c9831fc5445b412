"""Triton's model configuration derived from a model's metadata and settings
(``frontends/model_config.py``), on a real model table: the batch dimension, the most rows
a request may hold, dims and reshape, dynamic batching and each version policy."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from inferpool.engine.states import ModelState, ModelStatus, ModelTable
from inferpool.errors import ModelNotFound
from inferpool.frontends.model_config import model_config
from inferpool.settings import ModelSettings, ServerSettings


def client(status: ModelStatus, max_elements: int = 1000) -> Any:
    # model_config reads only the table and the server's element limit.
    table = ModelTable()
    table.set(status)
    return SimpleNamespace(table=table, settings=ServerSettings(max_tensor_elements=max_elements))


def iris(settings: ModelSettings | None = None, version: str | None = None) -> ModelStatus:
    metadata = {
        "platform": "sklearn",
        "inputs": [{"name": "input-0", "datatype": "FP64", "shape": [-1, 4]}],
        "outputs": [{"name": "predict", "datatype": "INT64", "shape": [-1]}],
    }
    return ModelStatus("iris", version, ModelState.READY, metadata=metadata, settings=settings)


def test_rows_are_the_batch_dimension_and_bound_max_batch_size() -> None:
    config = model_config(client(iris(), max_elements=1000), "iris", None)
    assert config == {
        "name": "iris",
        "platform": "sklearn",
        "backend": "inferpool",
        "version_policy": {"all": {}},
        "max_batch_size": 250,  # 1000 elements over 4 per row
        "input": [{"name": "input-0", "data_type": "TYPE_FP64", "dims": [4]}],
        # one value per row: Triton's [1] reshaped to []
        "output": [
            {"name": "predict", "data_type": "TYPE_INT64", "dims": [1], "reshape": {"shape": []}}
        ],
    }


def test_a_fixed_shape_has_no_batch_dimension() -> None:
    status = iris()
    status.metadata["inputs"] = [{"name": "image", "datatype": "BYTES", "shape": [2, 3]}]
    status.metadata["outputs"] = [{"name": "kind", "datatype": "", "shape": []}]
    config = model_config(client(status), "iris", None)
    assert config["max_batch_size"] == 0
    assert config["input"] == [{"name": "image", "data_type": "TYPE_STRING", "dims": [2, 3]}]
    assert config["output"] == [
        {"name": "kind", "data_type": "TYPE_INVALID", "dims": [1], "reshape": {"shape": []}}
    ]


def test_a_model_that_batches_says_its_queue_delay() -> None:
    settings = ModelSettings(name="iris", max_batch_size=16, max_batch_time=0.002)
    config = model_config(client(iris(settings)), "iris", None)
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 2000}
    alone = model_config(client(iris(ModelSettings(name="iris"))), "iris", None)
    assert "dynamic_batching" not in alone


@pytest.mark.parametrize(
    ("policy", "numbers_only", "expected"),
    [
        ({"latest": {"num_versions": 2}}, False, {"latest": {"num_versions": 2}}),
        ({"specific": {"versions": ["1", "v2"]}}, False, {"specific": {"versions": [1, "v2"]}}),
        ({"specific": {"versions": ["1", "v2"]}}, True, {"specific": {"versions": [1]}}),
        ({"all": {}}, True, {"all": {}}),
    ],
)
def test_the_version_policy_in_tritons_shape(policy, numbers_only, expected) -> None:
    settings = ModelSettings(name="iris", version_policy=policy)
    config = model_config(client(iris(settings, "1")), "iris", "1", numbers_only)
    assert config["version_policy"] == expected


def test_an_unknown_model_or_version_is_not_found() -> None:
    with pytest.raises(ModelNotFound):
        model_config(client(iris(version="1")), "nope", None)
    with pytest.raises(ModelNotFound):
        model_config(client(iris(version="1")), "iris", "9")
