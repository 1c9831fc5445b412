"""The pipeline parts that need no server: the settings format, the combinations and
the routers' keys, the load order and the cycle check, and a step's call in the raw
gRPC form (typed replies read too)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from inferpool.engine.pipelines.combine import combine, route_key
from inferpool.engine.pipelines.graph import find_cycle
from inferpool.engine.pipelines.manager import load_order
from inferpool.errors import BadRequest, InferpoolError
from inferpool.protocol import grpc_wire
from inferpool.protocol.grpc_raw import from_wire, to_wire
from inferpool.protocol.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from inferpool.settings import ModelSettings
from inferpool.settings.pipeline import Reference, parse_reference


def tensor(name: str, values: list) -> Tensor:
    data = np.array(values, dtype=object if isinstance(values[0], bytes) else None)
    datatype = "BYTES" if data.dtype == object else {"i": "INT64", "f": "FP64"}[data.dtype.kind]
    return Tensor(name, datatype, data.shape, data)


def pipeline(name: str, *children: str) -> ModelSettings:
    return ModelSettings(name=name, pipeline={"steps": [{"model": c} for c in children]})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pipeline.x", Reference("pipeline", "x")),
        ("pipeline.inputs.x", Reference("pipeline", "x")),
        ("scale.outputs.y", Reference("scale", "y")),
        ("scale.y", Reference("scale", "y")),
        ("parameters.tier", Reference("parameters", "tier")),
        ("parameters.outputs.x", Reference("parameters", "outputs.x")),
    ],
)
def test_references_read_both_spellings(text: str, expected: Reference) -> None:
    assert parse_reference(text) == expected


@pytest.mark.parametrize("text", ["x", ".x", "scale.", "scale.outputs."])
def test_a_malformed_reference_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"must be '<step>\.<output>'"):
        parse_reference(text)


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (
            [{"model": "a", "route": {"on": "a.b", "branches": {"0": {"model": "b"}}}}],
            "exactly one",
        ),
        ([{"route": {"on": "p.x", "branches": {"0": {"model": "b"}}}}], "needs a 'name'"),
        ([{"model": "a"}, {"model": "a"}], "a repeated"),
        ([{"model": "a", "name": "s.t"}], "cannot hold '.'"),
        (
            [{"name": "avg", "aggregate": {"models": [{"model": "a"}], "combine": "mean"}}],
            "at least 2",
        ),
        ([{"name": "r", "route": {"on": "a.b", "branches": {}}}], "at least 1"),
        ([{"model": "a", "inputs": {"x": "parameters.tier"}}], "a tensor must be named"),
    ],
)
def test_settings_errors(steps: list, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ModelSettings(name="p", pipeline={"steps": steps})


def test_concat_makes_columns_of_one_value_per_row() -> None:
    (joined,) = combine([[tensor("y", [1.0, 2.0])], [tensor("z", [3.0, 4.0])]], "concat")
    assert joined.name == "y" and joined.shape == (2, 2)
    np.testing.assert_array_equal(joined.data, [[1.0, 3.0], [2.0, 4.0]])


def test_mean_averages_each_output_position() -> None:
    first = [tensor("a", [1, 2]), tensor("b", [[0.0, 1.0]])]
    second = [tensor("x", [3, 6]), tensor("y", [[1.0, 0.0]])]
    mean_a, mean_b = combine([first, second], "mean")
    assert (mean_a.name, mean_a.datatype) == ("a", "FP64")
    np.testing.assert_array_equal(mean_a.data, [2.0, 4.0])
    np.testing.assert_array_equal(mean_b.data, [[0.5, 0.5]])


def test_vote_takes_the_majority_and_a_tie_goes_to_the_earliest_child() -> None:
    ballots = [
        [tensor("l", [0, 1, 2, 5])],
        [tensor("l", [1, 1, 0, 6])],
        [tensor("l", [1, 2, 0, 7])],
    ]
    (voted,) = combine(ballots, "vote")
    np.testing.assert_array_equal(voted.data, [1, 1, 0, 5])
    words = [[tensor("l", [b"cat", b"dog"])], [tensor("l", [b"dog", b"dog"])]]
    (voted,) = combine(words, "vote")
    assert voted.data.tolist() == [b"cat", b"dog"] and voted.datatype == "BYTES"


def test_combinations_refuse_what_does_not_line_up() -> None:
    with pytest.raises(InferpoolError, match="one shape"):
        combine([[tensor("y", [1.0, 2.0])], [tensor("y", [1.0])]], "mean")
    with pytest.raises(InferpoolError, match="must agree"):
        combine([[tensor("y", [1.0])], [tensor("y", [1.0]), tensor("z", [1.0])]], "mean")
    with pytest.raises(InferpoolError, match="mean needs numbers"):
        combine([[tensor("y", [b"a"])], [tensor("y", [b"b"])]], "mean")


def test_route_keys() -> None:
    assert route_key(np.array([[1], [1]]), "value", "t") == "1"
    assert route_key(np.array([2.0]), "value", "t") == "2"
    assert route_key(np.array([b"gold"], dtype=object), "value", "t") == "gold"
    assert route_key(np.array([[0.1, 0.7, 0.2], [0.2, 0.5, 0.3]]), "argmax", "t") == "1"
    assert route_key(True, "value", "t") == "true"
    assert route_key("silver", "value", "t") == "silver"
    with pytest.raises(BadRequest, match=r"chooses several branches \(0, 1\)"):
        route_key(np.array([[0.9, 0.1], [0.1, 0.9]]), "argmax", "'c.p'")
    with pytest.raises(BadRequest, match="is empty"):
        route_key(np.array([]), "value", "t")


def test_pipelines_load_after_the_pipelines_they_call() -> None:
    outer, inner, plain = (
        pipeline("outer", "inner", "m"),
        pipeline("inner", "m"),
        pipeline("p", "m"),
    )
    assert [s.name for s in load_order([outer, inner, plain])] == ["inner", "p", "outer"]
    a, b = pipeline("a", "b"), pipeline("b", "a")
    assert [s.name for s in load_order([a, b, plain])] == ["p", "a", "b"]  # a cycle: last


def test_cycles_are_found_through_other_pipelines() -> None:
    specs = {s.name: s.pipeline for s in (pipeline("b", "c"), pipeline("c", "a", "m"))}
    a = pipeline("a", "m", "b")
    assert a.pipeline is not None
    assert find_cycle("a", a.pipeline, specs.get) == ["a", "b", "c", "a"]
    assert find_cycle("a", pipeline("a", "m").pipeline, specs.get) == []  # type: ignore[arg-type]


def test_a_childs_request_and_reply_keep_every_datatype() -> None:
    tensors = [
        tensor("f", [[1.5, -2.0]]),
        tensor("i", [[-(2**62), 3]]),
        tensor("s", [b"a", b"\x00\xff"]),
    ]
    sent_request = InferenceRequest(tensors, None, [RequestedOutput("y")], {"k": "v"})
    request = grpc_wire.decode(to_wire(sent_request))
    assert request.raw_contents and request.parameters == {"k": "v"}
    assert [o.name for o in request.outputs] == ["y"]
    for sent, got in zip(tensors, request.inputs, strict=True):
        assert (got.name, got.datatype, got.shape) == (sent.name, sent.datatype, sent.shape)
        np.testing.assert_array_equal(got.data, sent.data)
    for raw in (True, False):  # a child answers raw when asked raw; typed is read too
        request.raw_contents = raw
        body, _ = grpc_wire.encode(InferenceResponse("m", tensors), request)
        for sent, got in zip(tensors, from_wire(body, writable=False).outputs, strict=True):
            assert (got.name, got.datatype, got.shape) == (sent.name, sent.datatype, sent.shape)
            np.testing.assert_array_equal(got.data, sent.data)
