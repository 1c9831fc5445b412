"""MLflow's scoring protocol as a codec (``codecs/mlflow_scoring.py``), without a server:
each JSON format and CSV to V2 inputs, a V2 response to ``{"predictions": ...}``, the
refusals as 400s naming the problem, and which endpoint answers which body."""

from __future__ import annotations

import numpy as np
import orjson
import pandas as pd
import pytest

from inferpool.codecs.mlflow_scoring import (
    UNNAMED,
    csv_as_json,
    from_json,
    predictions,
    read_csv,
    scoring_endpoint,
)
from inferpool.codecs.registry import encode_outputs
from inferpool.errors import BadRequest
from inferpool.protocol.mlflow_endpoints import INVOCATIONS, INVOCATIONS_CSV
from inferpool.protocol.types import InferenceRequest, InferenceResponse


def inputs(request: InferenceRequest) -> dict[str, tuple[str, tuple[int, ...], list]]:
    return {t.name: (t.datatype, t.shape, t.data.reshape(-1).tolist()) for t in request.inputs}


def test_a_split_frame_becomes_one_input_per_column() -> None:
    body = {"dataframe_split": {"columns": ["a", "b"], "data": [[1, 2.5], [3, 4.5]]}}
    assert inputs(from_json(orjson.dumps(body))) == {
        "a": ("INT64", (2,), [1, 3]),
        "b": ("FP64", (2,), [2.5, 4.5]),
    }


def test_records_are_a_frame_with_text_as_str_inputs() -> None:
    body = {"dataframe_records": [{"x": 1.0, "s": "hi"}, {"x": 2.0, "s": "yo"}]}
    request = from_json(orjson.dumps(body))
    by_name = {t.name: t for t in request.inputs}
    assert by_name["x"].data.tolist() == [1.0, 2.0]
    assert by_name["s"].datatype == "BYTES" and by_name["s"].content_type == "str"
    assert [bytes(v) for v in by_name["s"].data.reshape(-1)] == [b"hi", b"yo"]


def test_instances_of_records_are_read_as_a_frame() -> None:
    # MLflow reads a list of objects under instances as records too.
    request = from_json(orjson.dumps({"instances": [{"a": 1}, {"a": 2}]}))
    assert inputs(request) == {"a": ("INT64", (2,), [1, 2])}


def test_an_unnamed_array_is_one_input_and_named_arrays_one_each() -> None:
    unnamed = from_json(orjson.dumps({"instances": [[1, 2], [3, 4]]}))
    assert inputs(unnamed) == {UNNAMED: ("INT64", (2, 2), [1, 2, 3, 4])}
    named = from_json(orjson.dumps({"inputs": {"p": [1.5], "q": [[1, 2]]}}))
    assert inputs(named) == {"p": ("FP64", (1,), [1.5]), "q": ("INT64", (1, 2), [1, 2])}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "not valid JSON"),
        (b"[1]", "expected a JSON object"),
        (b'{"instances": [1], "inputs": [1]}', "exactly one of"),
        (b'{"instances": [1], "params": 3}', "'params' must be a JSON object"),
        (b'{"dataframe_split": [1]}', "expected an object with 'data'"),
        (b'{"dataframe_split": {"data": [[1]], "extra": 1}}', "unexpected member(s) extra"),
        (b'{"dataframe_records": 5}', "expected a list of rows"),
        (b'{"instances": [1, "a", [2]]}', "cannot read instances"),
    ],
)
def test_a_body_it_cannot_read_is_a_bad_request_naming_why(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match="invocations") as raised:
        from_json(body)
    assert message in raised.value.message


def test_csv_with_a_header_row_is_a_table_and_its_json_split() -> None:
    body = b"a,b\n1,x\n2,y\n"
    table = read_csv(body)
    assert list(table.columns) == ["a", "b"] and table["a"].tolist() == [1, 2]
    assert orjson.loads(csv_as_json(body)) == {
        "dataframe_split": {"columns": ["a", "b"], "data": [[1, "x"], [2, "y"]]}
    }


def test_a_csv_body_that_is_not_utf8_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="cannot read the CSV body"):
        read_csv(b"a\n\xff\xfe\n")


def _response(result: dict) -> InferenceResponse:
    outputs, content_type = encode_outputs(result)
    parameters = {"content_type": content_type} if content_type else {}
    return InferenceResponse("m", outputs, parameters=parameters)


def test_predictions_of_one_output_are_its_values() -> None:
    answer = predictions(_response({"predict": np.array([0, 1, 1])}))
    assert orjson.loads(answer) == {"predictions": [0, 1, 1]}


def test_predictions_of_several_outputs_are_an_object() -> None:
    answer = predictions(_response({"label": np.array([1]), "score": np.array([0.5])}))
    assert orjson.loads(answer) == {"predictions": {"label": [1], "score": [0.5]}}


def test_predictions_of_a_table_are_its_records() -> None:
    frame = pd.DataFrame({"label": [1, 2], "name": ["a", "b"]})
    answer = predictions(_response({"table": frame}))
    assert orjson.loads(answer) == {
        "predictions": [{"label": 1, "name": "a"}, {"label": 2, "name": "b"}]
    }


def _total(request: InferenceRequest) -> InferenceResponse:
    """A model: the sum of every input's values."""
    total = sum(float(t.data.astype(np.float64).sum()) for t in request.inputs)
    return _response({"total": np.array([total])})


def test_the_json_endpoint_runs_the_model_on_the_body() -> None:
    endpoint = scoring_endpoint(INVOCATIONS, {}, _total)
    assert endpoint is not None
    body = orjson.dumps({"dataframe_split": {"columns": ["a"], "data": [[1], [2]]}})
    assert orjson.loads(endpoint(body)) == {"predictions": [3.0]}


def test_the_csv_endpoint_runs_the_model_unless_the_runtime_reads_json_itself() -> None:
    ours = scoring_endpoint(INVOCATIONS_CSV, {}, _total)
    assert ours is not None and orjson.loads(ours(b"a,b\n1,2\n")) == {"predictions": [3.0]}
    seen: list[bytes] = []
    own = scoring_endpoint(INVOCATIONS_CSV, {INVOCATIONS: seen.append}, _total)
    assert own is not None
    own(b"a\n7\n")
    assert orjson.loads(seen[0]) == {"dataframe_split": {"columns": ["a"], "data": [[7]]}}


def test_other_endpoint_names_are_not_the_codecs() -> None:
    assert scoring_endpoint("explain", {}, _total) is None
