"""MLflow signatures as V2 metadata, and payloads checked against them."""

import numpy as np
import pandas as pd
import pytest
from mlflow.types import DataType
from mlflow.types.schema import Array, ColSpec, Schema, TensorSpec

from inferpool.errors import BadRequest
from inferpool.runtimes.mlflow_schema import check_payload, model_content_type, specs_of


def test_every_column_type_keeps_its_type():
    schema = Schema(
        [
            ColSpec(DataType.boolean, "flag"),
            ColSpec(DataType.integer, "count"),
            ColSpec(DataType.long, "id"),
            ColSpec(DataType.float, "ratio"),
            ColSpec(DataType.double, "price"),
            ColSpec(DataType.string, "city"),
            ColSpec(DataType.binary, "photo"),
            ColSpec(DataType.datetime, "when"),
            ColSpec(Array(DataType.double), "vector"),
            ColSpec(DataType.double, "extra", required=False),
        ]
    )
    specs = {s.name: s for s in specs_of(schema, "input")}
    assert {n: s.datatype for n, s in specs.items()} == {
        "flag": "BOOL",
        "count": "INT32",
        "id": "INT64",
        "ratio": "FP32",
        "price": "FP64",
        "city": "BYTES",
        "photo": "BYTES",
        "when": "BYTES",
        "vector": "BYTES",
        "extra": "FP64",
    }
    # MLServer's MLflow runtime's content types and column shape (mlserver_mlflow/metadata).
    content_types = {n: s.parameters.get("content_type") for n, s in specs.items()}
    assert content_types == {
        "flag": "np",
        "count": "np",
        "id": "np",
        "ratio": "np",
        "price": "np",
        "city": "str",
        "photo": "base64",
        "when": "datetime",
        "vector": "pd_json",
        "extra": "np",
    }
    assert specs["extra"].parameters["optional"] is True
    assert {tuple(s.shape) for s in specs.values()} == {(-1, 1)}


def test_tensor_specs_keep_dtype_shape_and_name():
    schema = Schema(
        [TensorSpec(np.dtype(np.float32), (-1, 4), "x"), TensorSpec(np.dtype(str), (-1,), "s")]
    )
    x, s = specs_of(schema, "input")
    assert (x.name, x.datatype, x.shape) == ("x", "FP32", [-1, 4])
    assert x.parameters == {"content_type": "np"}  # MLServer's; strings decode as str
    assert (s.name, s.datatype, s.parameters) == ("s", "BYTES", {"content_type": "str"})
    (unnamed,) = specs_of(Schema([TensorSpec(np.dtype(np.int64), (-1, 2))]), "input")
    assert (unnamed.name, unnamed.datatype, unnamed.shape) == ("input-0", "INT64", [-1, 2])


def test_no_schema_has_no_specs():
    assert specs_of(None, "input") == []
    assert model_content_type(None) is None


def test_the_model_content_type_is_mlservers():
    named = Schema([TensorSpec(np.dtype(np.float32), (-1, 4), "x")])
    unnamed = Schema([TensorSpec(np.dtype(np.float32), (-1, 4))])
    columns = Schema([ColSpec(DataType.double, "a")])
    assert [model_content_type(s) for s in (named, unnamed, columns)] == ["dict", "np", "pd"]


def test_unknown_and_missing_columns_are_refused():
    schema = Schema([ColSpec(DataType.double, "a"), ColSpec(DataType.double, "b", required=False)])
    check_payload("m", pd.DataFrame({"a": [1.0]}), schema)  # b is optional
    with pytest.raises(BadRequest, match="has no input 'z'; expected: a, b"):
        check_payload("m", pd.DataFrame({"a": [1.0], "z": [2.0]}), schema)
    with pytest.raises(BadRequest, match="is missing input 'a'"):
        check_payload("m", {"b": np.zeros(1)}, schema)


def test_single_tensor_shape_is_checked():
    schema = Schema([TensorSpec(np.dtype(np.float64), (-1, 4))])
    check_payload("m", np.zeros((2, 4)), schema)
    with pytest.raises(BadRequest, match=r"expects an input of shape \[-1, 4\], got \[2, 3\]"):
        check_payload("m", np.zeros((2, 3)), schema)
