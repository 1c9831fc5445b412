"""One request through a pipeline's plan (``engine/pipelines/runner.py``), with plans built
here and children faked by a caller: how each step's inputs are found, routers and
aggregators, the outputs answered, and the step each failure names."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from inferpool.engine.ipc.messages import Reply
from inferpool.engine.pipelines.graph import Call, Plan, Step
from inferpool.engine.pipelines.runner import Run
from inferpool.errors import BadRequest, InferpoolError, ModelNotFound
from inferpool.protocol.types import InferenceRequest, RequestedOutput, Tensor
from inferpool.settings.pipeline import PARAMETERS, PIPELINE, Reference

Child = Callable[[list[Tensor]], list[Tensor]]


def tensor(name: str, values: list[float]) -> Tensor:
    data = np.asarray(values, dtype=np.float64)
    return Tensor(name, "FP64", data.shape, data)


def call(
    model: str,
    inputs: dict[str, Reference] | None = None,
    declared: list[str] | None = None,
    outputs: list[str] | None = None,
) -> Call:
    return Call(model, None, inputs, declared or [], outputs, {}, {}, [])


class Children:
    """The child models: each a function of its inputs; records every call's inputs."""

    def __init__(self, **models: Child) -> None:
        self.models = models
        self.calls: list[tuple[str, list[str]]] = []
        self.status: dict[str, tuple[int, str]] = {}  # a child answering an error
        self.raises: dict[str, InferpoolError] = {}

    async def __call__(
        self, child: Call, inputs: list[Tensor], deadline: float | None
    ) -> tuple[list[Tensor], Reply]:
        self.calls.append((child.model, [t.name for t in inputs]))
        if child.model in self.raises:
            raise self.raises[child.model]
        if child.model in self.status:
            status, message = self.status[child.model]
            return [], Reply(status, message.encode())
        return self.models[child.model](inputs), Reply(200, b"")


def doubled(name: str = "y") -> Child:
    return lambda inputs: [tensor(name, list(inputs[0].data * 2))]


def run(
    steps: list[Step],
    children: Children,
    request: InferenceRequest,
    outputs: dict[str, Reference] | None = None,
) -> tuple[list[Tensor], Run]:
    plan = Plan("p", None, steps, outputs, set(children.models), {})
    runner = Run(plan, request, children)
    return asyncio.run(runner.run(None)), runner


def request(
    *tensors: Tensor, wanted: list[str] | None = None, **parameters: Any
) -> InferenceRequest:
    requested = [RequestedOutput(name) for name in wanted or []]
    return InferenceRequest(list(tensors), outputs=requested, parameters=parameters)


def test_steps_chain_by_default_and_by_declared_name_and_are_traced() -> None:
    children = Children(
        scale=doubled("y"),
        add=lambda inputs: [tensor("z", list(inputs[0].data + inputs[1].data))],
    )
    steps = [
        Step(1, "scale", call=call("scale")),
        # Declares x (the pipeline's) and y (the step before): found by name.
        Step(2, "add", call=call("add", declared=["y", "x"])),
    ]
    out, runner = run(steps, children, request(tensor("x", [1, 2])))
    assert [t.name for t in out] == ["z"] and out[0].data.tolist() == [3.0, 6.0]
    assert children.calls == [("scale", ["x"]), ("add", ["y", "x"])]
    assert [(t.index, t.step, t.model, t.status) for t in runner.traces] == [
        (1, "scale", "scale", 200),
        (2, "add", "add", 200),
    ]
    assert all(t.end_ns >= t.start_ns and t.reply is not None for t in runner.traces)


def test_explicit_mappings_rename_and_the_pipeline_s_outputs_map_its_answer() -> None:
    children = Children(scale=doubled("y"))
    steps = [Step(1, "s", call=call("scale", inputs={"in": Reference(PIPELINE, "x")}))]
    mapped = {"final": Reference("s", "y"), "echo": Reference(PIPELINE, "x")}
    out, _ = run(steps, children, request(tensor("x", [1])), outputs=mapped)
    assert [(t.name, t.data.tolist()) for t in out] == [("final", [2.0]), ("echo", [1.0])]
    assert children.calls == [("scale", ["in"])]


def test_requested_outputs_filter_the_answer_and_unknown_ones_are_400() -> None:
    children = Children(two=lambda inputs: [tensor("a", [1]), tensor("b", [2])])
    steps = [Step(1, "two", call=call("two"))]
    out, _ = run(steps, children, request(tensor("x", [0]), wanted=["b"]))
    assert [t.name for t in out] == ["b"]
    with pytest.raises(
        BadRequest, match="pipeline 'p' has no output 'c' \\(it answers 'a', 'b'\\)"
    ):
        run(steps, children, request(tensor("x", [0]), wanted=["c"]))


def test_a_router_calls_the_branch_its_tensor_chooses_else_the_default() -> None:
    children = Children(low=doubled(), high=doubled(), other=doubled())
    branches = {"0": call("low"), "1": call("high")}
    on = Reference(PIPELINE, "x")
    router = Step(1, "route", on=on, rule="argmax", branches=branches, default=call("other"))
    run([router], children, request(tensor("x", [0.1, 0.9])))
    run([router], children, request(tensor("x", [0.9, 0.1])))
    run([router], children, request(tensor("x", [0.1, 0.2, 0.7])))
    assert [model for model, _ in children.calls] == ["high", "low", "other"]


def test_a_router_on_a_parameter_and_its_refusals() -> None:
    children = Children(a=doubled(), b=doubled())
    router = Step(1, "route", on=Reference(PARAMETERS, "variant"), branches={"a": call("a")})
    run([router], children, request(tensor("x", [1]), variant="a"))
    assert children.calls == [("a", ["x"])]
    with pytest.raises(BadRequest, match="pipeline 'p', step 1 \\('route'\\): the request has no"):
        run([router], children, request(tensor("x", [1])))
    with pytest.raises(BadRequest, match="no branch for 'c' \\(branches: 'a'\\)"):
        run([router], children, request(tensor("x", [1]), variant="c"))
    router.default = call("b")  # without the parameter: the default branch
    run([router], children, request(tensor("x", [1])))
    assert children.calls[-1] == ("b", ["x"])


def test_an_aggregator_combines_its_children_and_a_failure_names_the_model() -> None:
    children = Children(one=doubled(), two=lambda inputs: [tensor("y", list(inputs[0].data * 4))])
    mean = Step(1, "avg", calls=[call("one"), call("two")], combine="mean")
    out, _ = run([mean], children, request(tensor("x", [1, 2])))
    assert out[0].data.tolist() == [3.0, 6.0]
    children.status["two"] = (503, "model 'two' is loading")
    with pytest.raises(InferpoolError) as raised:
        run([mean], children, request(tensor("x", [1])))
    assert raised.value.status == 503
    assert raised.value.message == (
        "pipeline 'p', step 1 ('avg'): model 'two': model 'two' is loading"
    )


def test_an_aggregator_s_other_children_are_cancelled_when_one_fails() -> None:
    cancelled: list[str] = []

    class Slow(Children):
        async def __call__(self, child: Call, inputs: list[Tensor], deadline: float | None) -> Any:
            if child.model == "slow":
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    cancelled.append(child.model)
                    raise
            return await super().__call__(child, inputs, deadline)

    children = Slow(fast=doubled(), slow=doubled())
    children.raises["fast"] = ModelNotFound("model 'fast' is not loaded")
    step = Step(1, "both", calls=[call("slow"), call("fast")], combine="concat")
    with pytest.raises(ModelNotFound, match="step 1 \\('both'\\): model 'fast': model 'fast' is"):
        run([step], children, request(tensor("x", [1])))
    assert cancelled == ["slow"]


def test_a_child_s_error_keeps_its_status_and_names_the_step() -> None:
    children = Children(scale=doubled(), after=doubled())
    children.status["scale"] = (400, "bad input")
    steps = [Step(1, "scale", call=call("scale")), Step(2, "after", call=call("after"))]
    with pytest.raises(BadRequest) as raised:
        run(steps, children, request(tensor("x", [1])))
    assert raised.value.message == "pipeline 'p', step 1 ('scale'): bad input"
    assert children.calls == [("scale", ["x"])]  # the next step never ran
    children.status.clear()
    children.raises["scale"] = ModelNotFound("model 'scale' is not loaded")
    with pytest.raises(ModelNotFound):
        run(steps, children, request(tensor("x", [1])))


def test_a_child_that_omits_an_output_the_step_lists_is_a_500() -> None:
    children = Children(scale=doubled("y"))
    steps = [Step(1, "scale", call=call("scale", outputs=["y", "extra"]))]
    with pytest.raises(InferpoolError) as raised:
        run(steps, children, request(tensor("x", [1])))
    assert raised.value.status == 500
    assert raised.value.message.endswith("model 'scale' answered no output 'extra'")


def test_references_to_what_is_missing_say_where_to_look() -> None:
    children = Children(scale=doubled("y"), next=doubled())
    needs_input = [Step(1, "s", call=call("scale", inputs={"in": Reference(PIPELINE, "w")}))]
    with pytest.raises(BadRequest, match="needs the input 'w' \\(the request has 'x'\\)"):
        run(needs_input, children, request(tensor("x", [1])))
    not_answered = [
        Step(1, "s", call=call("scale")),
        Step(2, "n", call=call("next", inputs={"in": Reference("s", "q")})),
    ]
    with pytest.raises(InferpoolError) as raised:
        run(not_answered, children, request(tensor("x", [1])))
    assert raised.value.status == 500
    assert "'s.q' was not answered (step 's' answered 'y'" in raised.value.message
