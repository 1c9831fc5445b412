"""Checking payloads against a model's features."""

import numpy as np
import pandas as pd
import pytest

from inferpool.errors import BadRequest
from inferpool.runtimes.tabular import (
    check_matrix,
    columns_in_order,
    features_matrix,
    labels_from_probabilities,
    two_class_probabilities,
)


def test_check_matrix_accepts_the_right_width():
    X = np.zeros((3, 4))
    assert check_matrix("m", X, 4) is X


@pytest.mark.parametrize(
    ("X", "message"),
    [
        (np.zeros((3, 5)), "expects 4 features, got 5"),
        (np.zeros(4), r"expects a 2-D input \[rows, 4\], got shape \[4\]"),
        (np.array([[b"a"] * 4], dtype=object), "expects numeric features"),
    ],
)
def test_check_matrix_says_what_was_expected(X, message):
    with pytest.raises(BadRequest, match=message):
        check_matrix("m", X, 4)


def test_check_matrix_can_allow_non_numeric():
    X = np.array([["a", "b"]], dtype=object)
    assert check_matrix("m", X, 2, numeric=False) is X


def test_columns_are_put_in_model_order():
    frame = pd.DataFrame({"b": [2.0], "a": [1.0]})
    assert list(columns_in_order("m", frame, ["a", "b"]).columns) == ["a", "b"]
    assert np.array_equal(features_matrix("m", frame, ["a", "b"]), [[1.0, 2.0]])


def test_unknown_and_missing_columns_are_named():
    with pytest.raises(BadRequest, match="has no input 'c'; expected: a, b"):
        columns_in_order("m", pd.DataFrame({"a": [1], "c": [2]}), ["a", "b"])
    with pytest.raises(BadRequest, match="is missing input 'b'; expected: a, b"):
        columns_in_order("m", pd.DataFrame({"a": [1]}), ["a", "b"])


def test_non_numeric_column_is_refused():
    with pytest.raises(BadRequest, match="not numeric: b"):
        features_matrix("m", pd.DataFrame({"a": [1.0], "b": ["x"]}), ["a", "b"])


def test_labels_and_two_class_probabilities():
    probabilities = two_class_probabilities(np.array([0.2, 0.7, 0.5]))
    assert np.allclose(probabilities, [[0.8, 0.2], [0.3, 0.7], [0.5, 0.5]])
    labels = labels_from_probabilities(probabilities, np.array(["no", "yes"]))
    assert labels.tolist() == ["no", "yes", "no"]  # a tie goes to the first class
