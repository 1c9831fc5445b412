"""How an MLServer custom runtime's batch is joined and split (``mlserver/adapter/batch.py``),
fact for fact as MLServer 1.7.1's ``mlserver/batching/requests.py`` does: inputs along
the first axis, parameters merged, outputs split by each request's rows."""

from __future__ import annotations

import numpy as np
import pytest

from inferpool.mlserver.adapter.batch import merge_requests, split_answer
from inferpool.protocol.types import InferenceRequest, RequestedOutput, Tensor
from inferpool.runtimes.base import Answer


def _request(request_id: str, rows: list[list[float]], tag: str, scale: int) -> InferenceRequest:
    data = np.array(rows, dtype=np.float64)
    parameters = {"content_type": "np", "tag": tag}
    return InferenceRequest(
        inputs=[Tensor("x", "FP64", data.shape, data, parameters)],
        id=request_id,
        outputs=[RequestedOutput("y", {"scale": scale})],
        parameters={"priority": scale, "headers": {"x-from": request_id}},
    )


def test_merge_concatenates_rows_and_merges_parameters() -> None:
    first = _request("a", [[1.0, 2.0]], "left", 1)
    second = _request("b", [[3.0, 4.0], [5.0, 6.0]], "right", 2)
    merged, sizes = merge_requests([first, second])
    assert sizes == [1, 2]
    assert merged.id is None  # MLServer's joined request has no id
    assert merged.parameters == {"priority": 2, "headers": {"x-from": "b"}}  # last wins
    (joined,) = merged.inputs
    assert joined.shape == (3, 2)
    assert joined.data.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    # A key both set becomes the list of their values; content_type keeps one.
    assert joined.parameters == {"content_type": "np", "tag": ["left", "right"]}
    assert [(o.name, o.parameters) for o in merged.outputs] == [("y", {"scale": 2})]


def test_merge_without_requested_outputs_asks_for_none() -> None:
    bare = InferenceRequest(inputs=[Tensor("x", "FP64", (1,), np.array([1.0]))])
    merged, sizes = merge_requests([bare, bare])
    assert merged.outputs == [] and sizes == [1, 1]
    assert merged.inputs[0].parameters == {}


def test_split_cuts_outputs_by_rows_and_per_row_parameters() -> None:
    scores = np.array([[10.0], [30.0], [50.0]])
    parameters = {"content_type": "np", "score": [0.1, 0.2, 0.3]}
    answer = Answer({"y": Tensor("y", "FP64", (3, 1), scores, parameters)}, {"model": "m"})
    first, second = split_answer(answer, [1, 2])
    assert isinstance(first, Answer) and first.parameters == {"model": "m"}
    assert second.parameters == {"model": "m"}  # every request gets the response's
    assert first["y"].shape == (1, 1) and first["y"].data.tolist() == [[10.0]]
    assert second["y"].shape == (2, 1) and second["y"].data.tolist() == [[30.0], [50.0]]
    # A per-row list: each request its first row's value, as text.
    assert first["y"].parameters == {"content_type": "np", "score": "0.1"}
    assert second["y"].parameters == {"content_type": "np", "score": "0.2"}


def test_split_refuses_an_output_without_the_batchs_rows() -> None:
    total = Tensor("sum", "FP64", (1,), np.array([9.0]))
    with pytest.raises(ValueError, match="not 3 rows"):
        split_answer({"sum": total}, [1, 2])
