"""``inferpool.calls``: a call's request body, its response decoded, its errors (the
server's side is tested end to end in tests/e2e/test_calls.py)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from inferpool import calls
from inferpool.calls import CallError


class Recording:
    """A backend that answers ``(status, body)`` and notes what it was asked."""

    def __init__(self, answer: tuple[int, bytes, int | None]) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str | None, bytes, int | None, float]] = []

    def call(self, model, version, body, json_length, timeout):
        self.asked.append((model, version, body, json_length, timeout))
        return self.answer


@pytest.fixture
def backend(request: pytest.FixtureRequest):
    installed = Recording((*request.param, None))
    calls.install(installed)
    yield installed
    calls.install(None)


RESPONSE = orjson.dumps(
    {
        "model_name": "iris",
        "outputs": [
            {"name": "p", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]},
            {"name": "label", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
        ],
    }
)


@pytest.mark.parametrize("backend", [(200, RESPONSE)], indirect=True)
def test_arrays_go_as_binary_tensors_and_json_outputs_come_back_as_arrays(backend) -> None:
    rows = np.arange(6, dtype=np.int32).reshape(3, 2)
    names = np.array(["x", "y"])
    answer = calls.infer("iris", {"rows": rows, "names": names}, version="2", outputs=["p"])
    ((model, version, body, json_length, timeout),) = backend.asked
    assert (model, version, timeout) == ("iris", "2", calls.DEFAULT_TIMEOUT)
    document = orjson.loads(body[:json_length])
    assert document["inputs"] == [
        {"name": "rows", "shape": [3, 2], "datatype": "INT32",
         "parameters": {"binary_data_size": 24}},
        {"name": "names", "shape": [2], "datatype": "BYTES", "data": ["x", "y"]},
    ]  # fmt: skip
    assert body[json_length:] == rows.astype("<i4").tobytes()
    assert document["outputs"] == [{"name": "p"}]
    assert document["parameters"] == {"binary_data_output": True}
    p, label = answer["outputs"]
    assert p["data"].dtype == np.float32 and p["data"].tolist() == [[1, 2], [3, 4]]
    assert label["data"].dtype == object and label["data"].tolist() == ["a", "b"]


def test_binary_outputs_are_read_after_the_json() -> None:
    proba = np.array([[0.25, 0.75], [1.0, 0.0]])
    words = b"".join(len(w).to_bytes(4, "little") + w for w in (b"yes", b"\xff"))
    head = orjson.dumps(
        {"outputs": [
            {"name": "p", "datatype": "FP64", "shape": [2, 2],
             "parameters": {"binary_data_size": proba.nbytes}},
            {"name": "w", "datatype": "BYTES", "shape": [2],
             "parameters": {"binary_data_size": len(words)}},
        ]}
    )  # fmt: skip
    response = calls.decode_response(head + proba.tobytes() + words, len(head))
    p, w = response["outputs"]
    assert p["data"].tolist() == proba.tolist() and p["data"].flags.writeable
    assert w["data"].tolist() == ["yes", b"\xff"]


@pytest.mark.parametrize("backend", [(404, b"model 'nope' not found")], indirect=True)
def test_a_failed_call_raises_with_the_callees_status_and_message(backend) -> None:
    with pytest.raises(CallError) as raised:
        calls.infer("nope", [{"name": "x", "shape": [1], "datatype": "FP64", "data": [1]}])
    assert raised.value.status == 404
    assert raised.value.message == "call to model 'nope' failed: model 'nope' not found"


def test_outside_a_server_a_call_is_refused() -> None:
    with pytest.raises(CallError, match="calls run only inside a server's runtime"):
        calls.infer("iris", {"x": np.ones(2)})


@pytest.mark.parametrize("backend", [(200, RESPONSE)], indirect=True)
def test_a_timeout_must_be_positive(backend) -> None:
    with pytest.raises(CallError, match="timeout must be positive") as raised:
        calls.infer("iris", {"x": np.ones(2)}, timeout=0)
    assert raised.value.status == 400 and not backend.asked
