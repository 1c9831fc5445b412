"""The graph's tensors in V2 terms (``runtimes/onnx_types.py``): datatypes, dynamic axes
as -1, requests' arrays checked and cast for the graph, ZipMap's dicts as a matrix.
Pure functions: they run without onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from inferpool.errors import BadRequest
from inferpool.runtimes.onnx_types import as_graph_input, as_tensor, check_array, graph_tensor


@pytest.mark.parametrize(
    ("type_name", "datatype"),
    [
        ("tensor(float)", "FP32"),
        ("tensor(double)", "FP64"),
        ("tensor(int64)", "INT64"),
        ("tensor(int32)", "INT32"),
        ("tensor(uint8)", "UINT8"),
        ("tensor(bool)", "BOOL"),
        ("tensor(float16)", "FP16"),
        ("tensor(string)", "BYTES"),
        ("seq(map(int64,tensor(float)))", "FP32"),
        ("seq(map(string,tensor(float)))", "FP32"),
    ],
)
def test_each_onnx_type_has_its_v2_datatype(type_name: str, datatype: str) -> None:
    assert graph_tensor("t", type_name, [None]).spec().datatype == datatype


def test_symbolic_and_unknown_axes_are_minus_one() -> None:
    spec = graph_tensor("x", "tensor(float)", ["N", None, 4, "batch"]).spec()
    assert spec.to_dict() == {"name": "x", "datatype": "FP32", "shape": [-1, -1, 4, -1]}


def test_a_zipmap_output_is_a_rows_by_classes_matrix_in_metadata() -> None:
    spec = graph_tensor("output_probability", "seq(map(int64,tensor(float)))", []).spec()
    assert (spec.datatype, spec.shape) == ("FP32", [-1, -1])


def test_zipmap_rows_become_float32_columns_in_key_order() -> None:
    rows = [{2: 0.1, 0: 0.7, 1: 0.2}, {2: 0.5, 0: 0.25, 1: 0.25}]
    matrix = as_tensor(rows)
    assert matrix.dtype == np.float32
    np.testing.assert_array_equal(matrix, np.float32([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]]))


def test_string_keyed_zipmap_and_plain_arrays() -> None:
    assert as_tensor([{"a": 1.0, "b": 0.0}]).shape == (1, 2)
    assert as_tensor([{7: 1.0}, {7: 1.0}]).tolist() == [[1.0], [1.0]]  # one class
    array = np.arange(3)
    assert as_tensor(array) is array
    np.testing.assert_array_equal(as_tensor([np.ones(2), np.zeros(2)]), [[1, 1], [0, 0]])


def test_fp64_rows_are_cast_to_a_float_graph() -> None:
    tensor = graph_tensor("x", "tensor(float)", ["N", 3])
    rows = check_array("m", tensor, np.array([[1.0, 2.5, 1e-8]]))
    cast = as_graph_input(tensor, rows)
    assert cast.dtype == np.float32
    np.testing.assert_array_equal(cast, np.float32([[1.0, 2.5, 1e-8]]))


def test_integers_go_to_a_float_graph_but_floats_not_to_an_integer_one() -> None:
    floats = graph_tensor("x", "tensor(float)", [None, 2])
    assert as_graph_input(floats, check_array("m", floats, np.int64([[1, 2]]))).dtype == np.float32
    integers = graph_tensor("k", "tensor(int64)", [None, 2])
    with pytest.raises(BadRequest, match=r"input 'k' takes INT64 values, got float64 data"):
        check_array("m", integers, np.array([[1.5, 2.0]]))


def test_bytes_become_strings_for_a_string_graph() -> None:
    tensor = graph_tensor("text", "tensor(string)", [None, 1])
    value = np.array([[b"caf\xc3\xa9"], [b"tea"]], dtype=object)
    cast = as_graph_input(tensor, check_array("m", tensor, value))
    assert cast.tolist() == [["café"], ["tea"]]


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((2, 5), r"input 'x' expects shape \[-1, 4\], got \[2, 5\]"),
        ((8,), r"input 'x' expects shape \[-1, 4\], got \[8\]"),
        ((0, 4), r"needs at least one row, got 0"),
    ],
)
def test_a_wrong_width_rank_or_no_rows_is_a_400(shape: tuple[int, ...], message: str) -> None:
    tensor = graph_tensor("x", "tensor(float)", ["N", 4])
    with pytest.raises(BadRequest, match=message):
        check_array("m", tensor, np.zeros(shape))


def test_per_row_frees_the_first_dimension_of_tensors_only() -> None:
    label = graph_tensor("label", "tensor(int64)", [1])  # as onnxmltools declares it
    assert label.per_row().shape == [-1]
    assert graph_tensor("p", "tensor(float)", [None, 3]).per_row().shape == [-1, 3]
    zipmap = graph_tensor("probabilities", "seq(map(int64,tensor(float)))", [])
    assert zipmap.per_row() is zipmap
