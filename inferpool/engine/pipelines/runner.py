"""One request through a pipeline's plan: steps in order, each feeding from the
pipeline's inputs and earlier steps' outputs by reference.

A model step calls its child; a router evaluates its rule and calls one branch; an
aggregator calls its children concurrently and combines their outputs. The child call
itself is the caller's (``manager.py`` sends it through the engine, as any request); the
runner records each call's timing and reply for the trace, and names the step in any
failure: ``pipeline 'p', step 2 ('scale'): <the child's message>``, with the child's status.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from inferpool.engine.ipc.messages import Reply
from inferpool.engine.pipelines.combine import combine, route_key
from inferpool.engine.pipelines.graph import Call, Plan, Step
from inferpool.errors import BadRequest, InferpoolError, from_status
from inferpool.protocol.types import InferenceRequest, Tensor
from inferpool.settings.pipeline import PARAMETERS, PIPELINE, Reference

# A child call: the call, its inputs and the deadline → its outputs and its reply.
Caller = Callable[[Call, list[Tensor], float | None], Awaitable[tuple[list[Tensor], Reply]]]


@dataclass(slots=True)
class StepTrace:
    """One child call of a request, for its trace: wall-clock times, the child's reply
    (its stage times) when it answered."""

    index: int
    step: str
    model: str
    start_ns: int
    end_ns: int
    status: int
    reply: Reply | None


class Run:
    """The state of one request through ``plan``: what each step answered so far."""

    def __init__(self, plan: Plan, request: InferenceRequest, caller: Caller) -> None:
        self.plan = plan
        self.request = request
        self.caller = caller
        self.scope: dict[str, dict[str, Tensor]] = {PIPELINE: {t.name: t for t in request.inputs}}
        self.previous: list[Tensor] = request.inputs
        self.traces: list[StepTrace] = []

    async def run(self, deadline: float | None) -> list[Tensor]:
        """The pipeline's outputs (as its ``outputs`` map them, else the last step's),
        filtered by the request's requested outputs."""
        for step in self.plan.steps:
            label = step.label(self.plan.name)
            try:
                outputs = await self._step(step, deadline)
            except InferpoolError as exc:
                raise from_status(exc.status, f"{label}: {exc.message}") from None
            self.scope[step.name] = {tensor.name: tensor for tensor in outputs}
            self.previous = outputs
        if self.plan.outputs is None:
            outputs = self.previous
        else:
            outputs = [
                _renamed(self._lookup(reference), name)
                for name, reference in self.plan.outputs.items()
            ]
        wanted = [requested.name for requested in self.request.outputs]
        if not wanted:
            return outputs
        by_name = {tensor.name: tensor for tensor in outputs}
        missing = [name for name in wanted if name not in by_name]
        if missing:
            raise BadRequest(
                f"pipeline '{self.plan.name}' has no output {', '.join(map(repr, missing))} "
                f"(it answers {', '.join(map(repr, by_name))})"
            )
        return [by_name[name] for name in wanted]

    async def _step(self, step: Step, deadline: float | None) -> list[Tensor]:
        if step.call is not None:
            return await self._call(step, step.call, deadline)
        if step.on is not None:
            return await self._call(step, self._branch(step), deadline)
        tasks = [asyncio.ensure_future(self._call(step, call, deadline)) for call in step.calls]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # one child failed: the others' answers are not needed
                task.cancel()
            raise
        return combine(list(results), step.combine, step.axis)

    def _branch(self, step: Step) -> Call:
        assert step.on is not None
        if step.on.source == PARAMETERS:
            value = self.request.parameters.get(step.on.name)
            if value is None and step.default is None:
                raise BadRequest(f"the request has no parameter '{step.on.name}' to route by")
            key = None if value is None else route_key(value, step.rule, f"'{step.on}'")
        else:
            key = route_key(self._lookup(step.on).data, step.rule, f"'{step.on}'")
        call = step.branches.get(key) if key is not None else None
        if call is None:
            call = step.default
        if call is None:
            raise BadRequest(
                f"no branch for {key!r} (branches: {', '.join(map(repr, step.branches))})"
            )
        return call

    async def _call(self, step: Step, call: Call, deadline: float | None) -> list[Tensor]:
        inputs = self._inputs(call)
        start = time.time_ns()
        trace = StepTrace(step.index, step.name, call.model, start, start, 0, None)
        self.traces.append(trace)
        try:
            outputs, reply = await self.caller(call, inputs, deadline)
        except InferpoolError as exc:
            trace.end_ns, trace.status = time.time_ns(), exc.status
            raise self._of_model(step, call, exc) from None
        trace.end_ns, trace.status, trace.reply = time.time_ns(), reply.status, reply
        if reply.status != 200:
            error = from_status(reply.status, reply.body.decode("utf-8", "replace"))
            raise self._of_model(step, call, error)
        if call.outputs is not None:
            answered = {tensor.name for tensor in outputs}
            missing = [name for name in call.outputs if name not in answered]
            if missing:
                raise InferpoolError(
                    f"model '{call.model}' answered no output {', '.join(map(repr, missing))}"
                )
        return outputs

    @staticmethod
    def _of_model(step: Step, call: Call, error: InferpoolError) -> InferpoolError:
        """An aggregator's child failure also names the model (the step has several)."""
        if not step.calls:
            return error
        return from_status(error.status, f"model '{call.model}': {error.message}")

    def _inputs(self, call: Call) -> list[Tensor]:
        """The child's inputs: its explicit mapping; else each input it declares, by
        name, from the newest step (or the pipeline's inputs) that has it; else the
        previous step's outputs as they are."""
        if call.inputs is not None:
            return [_renamed(self._lookup(ref), name) for name, ref in call.inputs.items()]
        matched = []
        for name in call.declared:
            for source in reversed(self.scope):
                tensor = self.scope[source].get(name)
                if tensor is not None:
                    matched.append(tensor)
                    break
        return matched or list(self.previous)

    def _lookup(self, reference: Reference) -> Tensor:
        tensor = self.scope.get(reference.source, {}).get(reference.name)
        if tensor is not None:
            return tensor
        if reference.source == PIPELINE:
            raise BadRequest(
                f"pipeline '{self.plan.name}' needs the input '{reference.name}' "
                f"(the request has {', '.join(map(repr, self.scope[PIPELINE])) or 'none'})"
            )
        answered = ", ".join(map(repr, self.scope.get(reference.source, {})))
        raise InferpoolError(
            f"'{reference}' was not answered (step '{reference.source}' answered {answered}; "
            "list the output in that step's 'outputs')"
        )


def _renamed(tensor: Tensor, name: str) -> Tensor:
    if tensor.name == name:
        return tensor
    return Tensor(name, tensor.datatype, tensor.shape, tensor.data, tensor.parameters)
