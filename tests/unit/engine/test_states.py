"""What a version that is not READY answers (``ModelStatus.refusal``), which states count
for the server's readiness, and how a result is cut to the requested outputs
(``inference.only_requested``)."""

from __future__ import annotations

import numpy as np
import pytest

from inferpool.engine.states import UNLOADED, ModelState, ModelStatus, ModelTable
from inferpool.engine.worker.inference import only_requested
from inferpool.errors import ModelLoading, ModelNotFound, NotReady
from inferpool.protocol.types import RequestedOutput
from inferpool.runtimes.base import Answer


@pytest.mark.parametrize(
    ("state", "reason", "kind", "status", "retry", "message"),
    [
        (ModelState.UNAVAILABLE, UNLOADED, ModelNotFound, 404, False,
         "model 'm' was unloaded (load it again to serve it)"),
        (ModelState.UNLOADING, "", ModelNotFound, 404, False, "model 'm' is being unloaded"),
        (ModelState.LOADING, "", ModelLoading, 503, True, "model 'm' is LOADING"),
        (ModelState.LOADING, "reloading: its workers restarted", ModelLoading, 503, True,
         "model 'm' is LOADING: reloading: its workers restarted"),
        (ModelState.FAILED, "boom", NotReady, 503, False, "model 'm' failed to load: boom"),
        (ModelState.UNAVAILABLE, "step 1: model 'c' is LOADING", NotReady, 503, False,
         "model 'm' is UNAVAILABLE: step 1: model 'c' is LOADING"),
    ],
)  # fmt: skip
def test_each_state_refuses_with_its_status(state, reason, kind, status, retry, message) -> None:
    error = ModelStatus("m", None, state, reason).refusal()
    assert type(error) is kind
    assert (error.status, error.retry_after, error.message) == (status, retry, message)


def test_ready_model_raises_the_refusal() -> None:
    table = ModelTable()
    table.set(ModelStatus("m", "2", ModelState.UNAVAILABLE, UNLOADED))
    with pytest.raises(ModelNotFound, match=r"^model 'm' version '2' was unloaded"):
        table.ready_model("m", "2")


def test_unavailable_does_not_make_the_server_not_ready_failed_does() -> None:
    table = ModelTable()
    table.set(ModelStatus("a", None, ModelState.READY, required=True))
    # A pipeline waiting for a member it calls: the member counts for itself.
    table.set(ModelStatus("p", None, ModelState.UNAVAILABLE, "step 1: ...", required=True))
    assert table.not_ready_reason(allow_empty=False) is None
    table.set(ModelStatus("b", None, ModelState.FAILED, "boom", required=True))
    assert table.not_ready_reason(allow_empty=False) == "model 'b' failed to load: boom"


def asked(*names: str) -> list[RequestedOutput]:
    return [RequestedOutput(name) for name in names]


def test_only_requested_keeps_the_named_outputs_in_the_requests_order() -> None:
    result = {"s": np.ones(2), "calls": np.array([1]), "pid": np.array([7])}
    assert list(only_requested(result, asked("pid", "s"))) == ["pid", "s"]
    assert only_requested(result, asked("s", "calls", "pid")) is result  # nothing to drop


def test_only_requested_keeps_an_answers_parameters() -> None:
    answer = Answer({"a": 1, "b": 2}, {"content_type": "np"})
    kept = only_requested(answer, asked("b"))
    assert type(kept) is Answer and dict(kept) == {"b": 2}
    assert kept.parameters == {"content_type": "np"}


def test_a_result_answering_none_of_the_names_is_kept_whole() -> None:
    # MLServer's LightGBM runtime answers `predict` whatever name the request asks for.
    result = {"predict": np.ones(2)}
    assert only_requested(result, asked("probabilities")) is result
