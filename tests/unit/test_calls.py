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

    def __init__(self, status: int, body: bytes) -> None:
        self.answer = (status, body)
        self.asked: list[tuple[str, str | None, dict, float]] = []

    def call(self, model: str, version: str | None, body: bytes, timeout: float):
        self.asked.append((model, version, orjson.loads(body), timeout))
        return self.answer


@pytest.fixture
def backend(request: pytest.FixtureRequest):
    installed = Recording(*request.param)
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
def test_arrays_go_as_v2_tensors_and_outputs_come_back_as_arrays(backend) -> None:
    rows = np.arange(6, dtype=np.int32).reshape(3, 2)
    names = np.array(["x", "y"])
    answer = calls.infer("iris", {"rows": rows, "names": names}, version="2", outputs=["p"])
    ((model, version, body, timeout),) = backend.asked
    assert (model, version, timeout) == ("iris", "2", calls.DEFAULT_TIMEOUT)
    assert body["inputs"] == [
        {"name": "rows", "shape": [3, 2], "datatype": "INT32", "data": [0, 1, 2, 3, 4, 5]},
        {"name": "names", "shape": [2], "datatype": "BYTES", "data": ["x", "y"]},
    ]
    assert body["outputs"] == [{"name": "p"}]
    p, label = answer["outputs"]
    assert p["data"].dtype == np.float32 and p["data"].tolist() == [[1, 2], [3, 4]]
    assert label["data"].dtype == object and label["data"].tolist() == ["a", "b"]


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
