"""Malformed payloads are a 400 naming the input and the problem; shapes stay as declared."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from inferpool.codecs.payload import decode_payload
from inferpool.errors import BadRequest
from inferpool.protocol import rest_json, rest_wire
from inferpool.protocol.binary import bytes_elements_to_wire


def request(*inputs: dict, **parameters):
    document = {"inputs": list(inputs)}
    if parameters:
        document["parameters"] = parameters
    return rest_json.decode_request(orjson.dumps(document))


def text_input(name: str, values: list[str], content_type: str | None, shape=None) -> dict:
    tensor = {"name": name, "datatype": "BYTES", "shape": shape or [len(values)], "data": values}
    if content_type:
        tensor["parameters"] = {"content_type": content_type}
    return tensor


def decode(req, accepts: str = "dict", defaults: dict | None = None):
    return decode_payload(req, accepts, defaults or {})


@pytest.mark.parametrize(
    ("content_type", "values", "problem"),
    [
        ("base64", ["aGVsbG8=", "not base64!"], "element 1 is not valid base64"),
        ("json", ['{"a": 1}', "{oops"], "element 1 is not valid JSON"),
        ("datetime", ["2024-01-01", "yesterday"], "element 1 ('yesterday') is not an ISO-8601"),
        ("nope", ["x"], "unknown content type 'nope'"),
    ],
)
def test_malformed_elements_name_input_and_problem(content_type, values, problem) -> None:
    with pytest.raises(BadRequest) as caught:
        decode(request(text_input("col", values, content_type)))
    assert "input 'col'" in caught.value.message
    assert problem in caught.value.message
    assert caught.value.status == 400


def test_invalid_utf8_under_str_is_a_400_over_binary() -> None:
    raw = bytes_elements_to_wire(np.array([b"ok", b"\xff\xfe"], dtype=object))
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"content_type": "str", "binary_data_size": len(raw)},
                }
            ]
        }
    )
    req = rest_wire.decode(header + raw, len(header))
    with pytest.raises(BadRequest, match="input 'text': element 1 is not valid UTF-8"):
        decode(req)


def test_str_on_numeric_data_is_a_400() -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}
    tensor["parameters"] = {"content_type": "str"}
    with pytest.raises(BadRequest, match="input 'x': content type 'str' needs BYTES data"):
        decode(request(tensor))


def test_unknown_request_content_type_is_a_400() -> None:
    req = request(text_input("a", ["x"], None), content_type="parquet")
    with pytest.raises(BadRequest, match="unknown content type 'parquet'"):
        decode(req)


def test_model_default_content_type_applies_when_input_is_silent() -> None:
    encoded = base64.b64encode(b"\x00\x01").decode()
    payload = decode(request(text_input("blob", [encoded], None)), defaults={"blob": "base64"})
    assert payload == {"blob": [b"\x00\x01"]}


def test_bytes_default_to_bytes_objects_in_the_declared_shape() -> None:
    payload = decode(request(text_input("t", ["a", "b", "c", "d"], None, shape=[2, 2])))
    assert payload["t"].shape == (2, 2)
    assert payload["t"].tolist() == [[b"a", b"b"], [b"c", b"d"]]


def test_pd_columns_of_unequal_length_are_a_400() -> None:
    req = request(
        {"name": "a", "datatype": "FP64", "shape": [3], "data": [1, 2, 3]},
        text_input("b", ["x", "y"], "str"),
        content_type="pd",
    )
    with pytest.raises(BadRequest, match="same number of rows: 'a' has 3, 'b' has 2"):
        decode(req)


def test_pd_multi_column_input_becomes_named_sub_columns_not_rows() -> None:
    req = request(
        {"name": "xy", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]},
        text_input("label", ["p", "q"], "str", shape=[2, 1]),
        content_type="pd",
    )
    frame = decode(req, "array")
    assert list(frame.columns) == ["xy_0", "xy_1", "label"]
    assert len(frame) == 2
    assert frame["xy_1"].tolist() == [2, 4]
    assert frame["label"].tolist() == ["p", "q"]
    assert frame["xy_0"].dtype == np.int32


def test_pd_three_dimensional_input_is_a_400() -> None:
    tensor = {"name": "cube", "datatype": "FP32", "shape": [1, 2, 2], "data": [1, 2, 3, 4]}
    with pytest.raises(BadRequest, match="pd input 'cube' has shape \\[1, 2, 2\\]"):
        decode(request(tensor, content_type="pd"))


def test_pd_mixed_dtypes_each_by_its_own_codec() -> None:
    req = request(
        {"name": "n", "datatype": "FP32", "shape": [2], "data": [0.5, 1.5]},
        text_input("s", ["α", "β"], "str"),
        text_input("t", ["2024-01-01T00:00:00", "2024-06-01T12:30:00"], "datetime"),
        text_input("j", ['{"k": [1]}', "null"], "json"),
        content_type="pd",
    )
    frame = decode(req, "array")  # a pd request overrides the kind the runtime accepts
    assert str(frame["n"].dtype) == "float32"
    assert frame["s"].tolist() == ["α", "β"]
    assert str(frame["t"].dtype).startswith("datetime64")
    assert frame["t"][1].hour == 12
    assert frame["j"].tolist() == [{"k": [1]}, None]


def test_datetime_with_offsets_becomes_utc() -> None:
    payload = decode(request(text_input("t", ["2024-01-01T10:00:00+02:00"], "datetime")))
    assert payload["t"].tolist()[0].hour == 8


def test_binary_input_is_a_zero_copy_view_of_the_body() -> None:
    values = np.arange(6, dtype=np.float32)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [2, 3],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ]
        }
    )
    padding = b" " * (-len(header) % 4)  # JSON allows trailing whitespace: align the tail
    body = header + padding + values.tobytes()
    req = rest_wire.decode(body, len(header + padding))
    array = req.inputs[0].data
    assert array.shape == (2, 3)
    assert np.array_equal(array.reshape(-1), values)
    assert np.shares_memory(array, np.frombuffer(body, dtype=np.uint8))


def test_misaligned_binary_input_is_copied_once_and_aligned() -> None:
    values = np.arange(3, dtype=np.float64)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP64",
                    "shape": [3],
                    "parameters": {"binary_data_size": 24},
                }
            ]
        }
    )
    header += b" " * (1 if len(header) % 8 == 0 else 0)
    req = rest_wire.decode(header + values.tobytes(), len(header))
    assert req.inputs[0].data.flags.aligned
    assert req.inputs[0].data.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("size", "problem"),
    [(100, "runs past the body"), (-1, "non-negative integer"), (4, "bytes after the last")],
)
def test_bad_binary_data_size_is_a_400(size: int, problem: str) -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "INT32",
                    "shape": [1],
                    "parameters": {"binary_data_size": size},
                }
            ]
        }
    )
    with pytest.raises(BadRequest, match=problem):
        rest_wire.decode(header + b"\0" * 8, len(header))


def test_nan_and_infinity_literals_are_read_and_written() -> None:
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [NaN, Infinity, -Infinity]}]}'  # noqa: E501
    data = rest_json.decode_request(body).inputs[0].data
    assert np.isnan(data[0]) and data[1] == np.inf and data[2] == -np.inf
    assert data.dtype == np.float32


def test_uint64_beyond_int64_is_exact_over_json() -> None:
    tensor = {"name": "u", "datatype": "UINT64", "shape": [2], "data": [2**64 - 1, 0]}
    assert request(tensor).inputs[0].data.tolist() == [2**64 - 1, 0]
    too_big = b'{"inputs": [{"name": "u", "datatype": "UINT64", "shape": [1], "data": [%d]}]}'
    with pytest.raises(BadRequest):
        rest_json.decode_request(too_big % 2**64)
    with pytest.raises(BadRequest, match="out of range for UINT64"):
        request({**tensor, "data": [-1, 2**63]})
