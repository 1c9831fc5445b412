"""A whole request to the payload a runtime accepts (``codecs/payload.py``): arrays side by
side, a one-matrix table named by the model's features, the request's and the model's
content types, and the refusals (rows that differ, a scalar, an unknown content type)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from inferpool.codecs.payload import check_model_content_type, decode_payload, payload_kind
from inferpool.errors import BadRequest, ModelLoadError
from inferpool.protocol.types import InferenceRequest, Tensor


def tensor(name: str, values: list, shape: tuple[int, ...], content_type: str | None = None):
    data = np.array(values, dtype=np.float64).reshape(shape)
    parameters = {"content_type": content_type} if content_type else {}
    return Tensor(name, "FP64", shape, data, parameters)


def test_several_inputs_are_their_columns_side_by_side() -> None:
    request = InferenceRequest([tensor("a", [1, 2], (2,)), tensor("b", [3, 4, 5, 6], (2, 2))])
    payload = decode_payload(request, "array", {})
    assert payload.tolist() == [[1, 3, 4], [2, 5, 6]]


def test_inputs_of_different_rows_or_a_scalar_are_refused_by_name() -> None:
    uneven = InferenceRequest([tensor("a", [1, 2], (2,)), tensor("b", [3], (1,))])
    with pytest.raises(BadRequest, match="same number of rows: 'a' has 2, 'b' has 1"):
        decode_payload(uneven, "array", {})
    scalar = InferenceRequest([tensor("a", [1, 2], (2,)), tensor("s", [3], ())])
    with pytest.raises(BadRequest, match="input 's' is a scalar"):
        decode_payload(scalar, "array", {})


def test_one_matrix_for_a_table_model_takes_its_feature_names() -> None:
    request = InferenceRequest([tensor("input-0", [1, 2, 3, 4], (2, 2))])
    frame = decode_payload(request, "dataframe", {}, column_names=["x", "y"])
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["x", "y"]
    assert frame["y"].tolist() == [2, 4]
    # A width that is not the features' count is a table of its own input's columns.
    other = decode_payload(request, "dataframe", {}, column_names=["x", "y", "z"])
    assert list(other.columns) == ["input-0_0", "input-0_1"]


def test_the_requests_content_type_wins_over_what_the_runtime_accepts() -> None:
    request = InferenceRequest([tensor("a", [1, 2], (2,))], parameters={"content_type": "pd"})
    assert isinstance(decode_payload(request, "array", {}), pd.DataFrame)
    as_request = decode_payload(request, "request", {})
    assert as_request is request  # a runtime that reads the request itself


def test_the_models_content_type_stands_in_for_a_request_without_one() -> None:
    request = InferenceRequest([tensor("a", [1, 2], (2,))])
    assert isinstance(decode_payload(request, "array", {}, model_content_type="pd"), pd.DataFrame)
    # An input content type is every input's default instead.
    text = Tensor("t", "BYTES", (1,), np.array([b"hi"], dtype=object))
    decoded = decode_payload(InferenceRequest([text]), "dict", {}, model_content_type="str")
    assert decoded == {"t": ["hi"]}


def test_content_types_it_does_not_know_are_refused() -> None:
    assert payload_kind("np") == "array" and payload_kind("pd") == "dataframe"
    with pytest.raises(BadRequest, match="np, ndarray, numpy"):
        payload_kind("nope")
    check_model_content_type(None)
    check_model_content_type("str")
    with pytest.raises(ModelLoadError, match=r"parameters\.content_type in model-settings\.json"):
        check_model_content_type("nope")
