"""Triton's trace settings over the tracer (``observability.trace_control``): which
requests the rate, the count and the level let through, server-wide and per model, and
the values refused."""

from __future__ import annotations

import pytest

from inferpool.errors import BadRequest
from inferpool.observability.trace_control import TraceControl


@pytest.fixture
def control() -> TraceControl:
    control = TraceControl()
    control.start()
    return control


def admitted(control: TraceControl, model: str, count: int) -> list[bool]:
    return [control.admit(model) for _ in range(count)]


def test_every_request_by_default_then_one_in_n(control) -> None:
    assert admitted(control, "m", 3) == [True] * 3
    control.update({"trace_rate": "3"})
    assert admitted(control, "m", 6) == [False, False, True, False, False, True]
    control.update({"trace_rate": 0})
    assert not any(admitted(control, "m", 5))


def test_the_count_counts_down_then_stops(control) -> None:
    control.update({"trace_count": ["2"]})
    assert admitted(control, "m", 4) == [True, True, False, False]
    assert control.document()["trace_count"] == "0"
    control.update({"trace_count": None})
    assert control.document()["trace_count"] == "-1" and control.admit("m")


def test_a_models_settings_override_only_what_they_set(control) -> None:
    control.update({"trace_level": ["OFF"]}, "quiet")
    assert not control.admit("quiet") and control.admit("other")
    document = control.document("quiet")
    assert document["trace_level"] == ["OFF"] and document["trace_rate"] == "1"
    control.update({"trace_level": None}, "quiet")
    assert control.admit("quiet") and "quiet" not in control.models


def test_without_a_tracer_tracing_stays_off() -> None:
    control = TraceControl()
    assert control.document()["trace_level"] == ["OFF"] and not control.admit("m")
    with pytest.raises(BadRequest, match="--tracing"):
        control.update({"trace_level": ["TIMESTAMPS"]})


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"trace_rate": "x"}, "trace_rate must be an integer"),
        ({"trace_rate": True}, "trace_rate must be an integer"),
        ({"trace_rate": ["1", "2"]}, "takes one value"),
        ({"trace_count": "-2"}, "between -1"),
        ({"trace_level": ["TIMESTAMPS", "TENSORS"]}, "TENSORS is not supported"),
        ({"trace_level": [3]}, "list of strings"),
        ({"trace_mode": "triton"}, "trace_mode cannot be changed"),
        ({"nope": "1"}, "unknown trace setting"),
    ],
)
def test_bad_values_change_nothing(control, changes, words) -> None:
    before = control.document()
    with pytest.raises(BadRequest, match=words):
        control.update({"trace_rate": "7", **changes})
    assert control.document() == before
