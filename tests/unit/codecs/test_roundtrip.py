"""decode(encode(x)) == x for every codec and datatype, in memory and over the REST wire."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from inferpool.codecs.registry import decode_output, decode_response, encode_output, encode_outputs
from tests.unit.codecs.strategies import (
    NUMERIC,
    datetimes,
    json_values,
    numeric_arrays,
    shapes,
    texts,
    through_rest,
)

WIRES = pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])


def assert_same_array(got, expected: np.ndarray) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert np.array_equal(got, expected, equal_nan=expected.dtype.kind in "fcmM")


@settings(max_examples=150, deadline=None)
@given(numeric_arrays())
def test_numpy_codec_roundtrip(array: np.ndarray) -> None:
    tensor = encode_output("out", array)
    assert tensor.parameters["content_type"] == "np"
    assert_same_array(decode_output(tensor), array)


@WIRES
@pytest.mark.parametrize("datatype", NUMERIC)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_numeric_roundtrip_over_rest(datatype: str, binary: bool, data) -> None:
    array = data.draw(numeric_arrays(datatype))
    (tensor,) = through_rest([encode_output("out", array)], binary).outputs
    assert list(tensor.shape) == list(array.shape)
    assert_same_array(decode_output(tensor), array)


@WIRES
@settings(max_examples=60, deadline=None)
@given(values=st.lists(texts, max_size=6))
def test_str_roundtrip(values: list[str], binary: bool) -> None:
    if not values:  # an empty list carries no type; it is an empty numeric array
        return
    (tensor,) = through_rest([encode_output("out", values)], binary).outputs
    assert tensor.parameters["content_type"] == "str"
    assert decode_output(tensor) == values


@WIRES
@settings(max_examples=40, deadline=None)
@given(array=hnp.arrays(object, shapes.filter(lambda s: len(s) >= 2), elements=texts))
def test_str_keeps_multidimensional_shape(array: np.ndarray, binary: bool) -> None:
    if array.size == 0:
        return  # nothing says these are strings
    (tensor,) = through_rest([encode_output("out", array)], binary).outputs
    decoded = decode_output(tensor)
    assert decoded.shape == array.shape
    assert decoded.tolist() == array.tolist()


@WIRES
@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.binary(max_size=10), min_size=1, max_size=6))
def test_base64_roundtrip(values: list[bytes], binary: bool) -> None:
    (tensor,) = through_rest([encode_output("out", values)], binary).outputs
    assert tensor.parameters["content_type"] == "base64"
    assert decode_output(tensor) == values


@WIRES
@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.dictionaries(texts, json_values, max_size=3), min_size=1, max_size=4))
def test_json_roundtrip(values: list[dict], binary: bool) -> None:
    (tensor,) = through_rest([encode_output("out", values)], binary).outputs
    assert tensor.parameters["content_type"] == "json"
    assert decode_output(tensor) == values


@settings(max_examples=30, deadline=None)
@given(document=st.dictionaries(texts, json_values, max_size=4))
def test_single_json_document_is_a_scalar(document: dict) -> None:
    (tensor,) = through_rest([encode_output("out", document)], False).outputs
    assert tensor.shape == ()
    assert decode_output(tensor) == document


@WIRES
@settings(max_examples=60, deadline=None)
@given(array=datetimes())
def test_datetime_roundtrip(array: np.ndarray, binary: bool) -> None:
    (tensor,) = through_rest([encode_output("out", array)], binary).outputs
    assert tensor.parameters["content_type"] == "datetime"
    decoded = decode_output(tensor)
    if np.isnat(array).all():  # no text says which unit: only the shape and NaT return
        assert np.shape(decoded) == array.shape
        assert np.isnat(decoded).all()
        return
    assert_same_array(np.asarray(decoded), array)


@st.composite
def frames(draw) -> pd.DataFrame:
    rows = draw(st.integers(0, 5))
    columns = {}
    for index in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["num", "str", "bytes", "json", "datetime"]))
        if kind == "num":
            values = draw(
                numeric_arrays(draw(st.sampled_from(NUMERIC))).filter(lambda a: a.ndim == 1)
            )
            values = np.resize(values, rows) if values.size else np.zeros(rows, values.dtype)
        elif kind == "str":
            values = draw(st.lists(texts, min_size=rows, max_size=rows))
        elif kind == "bytes":
            values = draw(st.lists(st.binary(max_size=5), min_size=rows, max_size=rows))
        elif kind == "json":
            documents = st.dictionaries(texts, json_values, max_size=2)
            values = draw(st.lists(documents, min_size=rows, max_size=rows))
        else:
            values = np.arange(rows).astype("datetime64[s]") + draw(st.integers(0, 2**31))
        columns[f"{kind}{index}"] = values
    return pd.DataFrame(columns)


@WIRES
@settings(max_examples=60, deadline=None)
@given(frame=frames())
def test_dataframe_roundtrip(frame: pd.DataFrame, binary: bool) -> None:
    if len(frame) == 0:  # an empty column carries no type to come back with
        frame = frame.iloc[:0, :0]
    outputs, content_type = encode_outputs({"out": frame})
    assert content_type == "pd"
    assert [t.name for t in outputs] == list(frame.columns)
    response = through_rest(outputs, binary, {"content_type": content_type})
    decoded = decode_response(response.outputs, response.parameters["content_type"])
    pd.testing.assert_frame_equal(decoded, frame, check_column_type=False)


@WIRES
def test_dict_roundtrip(binary: bool) -> None:
    result = {
        "scores": np.array([[0.5, np.inf], [np.nan, -1.0]], dtype=np.float32),
        "labels": ["cat", "dög"],
        "raw": [b"\x00\xff"],
        "info": {"model": "m", "n": 2},
        "when": np.array(["2024-02-29T12:00:00"], dtype="datetime64[s]"),
    }
    outputs, content_type = encode_outputs(result)
    assert content_type is None
    decoded = decode_response(through_rest(outputs, binary).outputs)
    assert decoded.keys() == result.keys()
    assert_same_array(decoded["scores"], result["scores"])
    assert decoded["labels"] == result["labels"]
    assert decoded["raw"] == result["raw"]
    assert decoded["info"] == result["info"]
    assert_same_array(decoded["when"], result["when"])


@pytest.mark.parametrize(
    "series",
    [
        pd.Series([1.5, np.nan], dtype=np.float32),
        pd.Series(["a", "ü"]),
        pd.Series(pd.to_datetime(["2024-01-01T05:00:00+05:00"])),
        pd.Series([b"\x00", b"\xff"]),
    ],
    ids=["float", "str", "tz-datetime", "bytes"],
)
def test_series_output_encodes_like_a_dataframe_column(series: pd.Series) -> None:
    (tensor,) = through_rest([encode_output("out", series)], False).outputs
    frame = decode_response([tensor], "pd")
    expected = series.dt.tz_convert(None) if hasattr(series.dtype, "tz") else series
    pd.testing.assert_series_equal(frame["out"], expected, check_names=False)
