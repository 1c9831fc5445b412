"""The pipelines an engine client serves: their load, their readiness and their requests.

A pipeline loads in the frontend's engine, not in a worker: loading checks its settings
against the models loaded now (``graph.build_plan``) and keeps the plan. Its requests
run here too: the pipeline's request is decoded once from its wire format, each step's
child is called through the client's own ``infer`` (the same dispatch as any request,
so a step on a worker is one ring hop, and the child's statistics count its calls), and
the pipeline's answer is encoded back in the caller's format. The reply carries a trace
of each child call (``PipelineReply.steps``), which the tracer makes into spans.

A pipeline's readiness follows its children's: ``sync`` turns a READY pipeline
UNAVAILABLE, naming the step, while a child is not READY, and READY again once it is.
Its requests meanwhile answer as the child's would (``refusal``): 404 for a child
unloaded on purpose, 503 (with ``Retry-After`` while it loads) otherwise.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferpool.engine.ipc.messages import Kind, Reply
from inferpool.engine.pipelines.graph import Call, Plan, PlanError, build_plan, check_cycle
from inferpool.engine.pipelines.runner import Run, StepTrace
from inferpool.engine.states import ModelKey, ModelState, ModelStatus, describe_key, model_key
from inferpool.errors import InferpoolError, ModelNotFound
from inferpool.protocol.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from inferpool.settings import ModelSettings
from inferpool.settings.pipeline import PipelineSpec

if TYPE_CHECKING:
    from inferpool.engine.client import EngineClient

# How long a pipeline's load waits for a child that is still loading (a large model
# loaded by the same repository call); then the child counts as not loaded.
CHILD_LOAD_WAIT = 600.0
_POLL = 0.05


@dataclass(slots=True)
class PipelineReply(Reply):
    """A pipeline's reply, with the trace of each child call it made."""

    steps: tuple[StepTrace, ...] = ()


def is_pipeline(settings: ModelSettings | None) -> bool:
    return settings is not None and settings.pipeline is not None


class Pipelines:
    """The pipelines loaded in one engine client, by version key."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self.plans: dict[ModelKey, Plan] = {}
        # Pipelines declared but maybe not loaded yet (a repository's start-up): the
        # cycle check follows them too.
        self._declared: dict[str, PipelineSpec] = {}
        self._held_down: set[ModelKey] = set()  # READY pipelines made UNAVAILABLE by sync

    # -- lifecycle ---------------------------------------------------------------------------
    def declare(self, settings: list[ModelSettings]) -> None:
        """Pipelines about to load (in dependency order, see ``load_order``)."""
        for one in settings:
            if one.pipeline is not None:
                self._declared[one.name] = one.pipeline

    async def load(self, settings: ModelSettings) -> dict[str, Any]:
        """Check the pipeline against the models loaded now; its metadata, or raise."""
        spec = settings.pipeline
        assert spec is not None
        self._declared[settings.name] = spec
        try:
            # A cycle first: its pipelines would wait for each other to load.
            check_cycle(settings.name, spec, self._spec_of)
            await self._wait_for_children(settings.name, spec)
            plan = build_plan(settings, self.client.table, self._spec_of)
        except PlanError as exc:
            self._undeclare(settings.name)
            raise InferpoolError(str(exc)) from None
        except BaseException:
            self._undeclare(settings.name)
            raise
        key = model_key(settings.name, settings.version)
        self.plans[key] = plan
        self._held_down.discard(key)
        return plan.metadata

    def drop(self, key: ModelKey) -> bool:
        """Forget the pipeline under ``key``; False when it is not one."""
        plan = self.plans.pop(key, None)
        self._held_down.discard(key)
        if plan is None:
            return False
        self._undeclare(plan.name)
        return True

    def _undeclare(self, name: str) -> None:
        """``name`` is no pipeline the cycle check follows, unless a version is loaded."""
        if not any(plan.name == name for plan in self.plans.values()):
            self._declared.pop(name, None)

    async def _wait_for_children(self, name: str, spec: PipelineSpec) -> None:
        deadline = time.monotonic() + CHILD_LOAD_WAIT
        table = self.client.table
        children = spec.children() - {name}
        while time.monotonic() < deadline and any(
            status.state is ModelState.LOADING
            for child in children
            for status in table.versions(child)
        ):
            await asyncio.sleep(_POLL)

    def _spec_of(self, name: str) -> PipelineSpec | None:
        declared = self._declared.get(name)
        if declared is not None:
            return declared
        for status in self.client.table.versions(name):
            if status.settings is not None and status.settings.pipeline is not None:
                return status.settings.pipeline
        # Not loaded: the repository's (a pipeline loaded by the API whose cycle runs
        # through pipelines not loaded yet).
        try:
            held = self.client.lifecycle.held(name)
        except InferpoolError:  # not a model name at all
            return None
        for found in held:
            if found.settings is not None and found.settings.pipeline is not None:
                return found.settings.pipeline
        return None

    def serves(self, name: str, version: str | None) -> bool:
        """Whether the model a request names is a pipeline loaded here (404 if unknown)."""
        return bool(self.plans) and self.client.table.find(name, version).key in self.plans

    # -- readiness ---------------------------------------------------------------------------
    def sync(self) -> None:
        """Each loaded pipeline READY exactly when every child it may call is READY."""
        table = self.client.table
        for key, plan in self.plans.items():
            status = table.get(key)
            if status is None:
                continue
            held = key in self._held_down
            if status.state is not ModelState.READY and not held:
                continue  # loading, unloading or failed: not ours to change
            reason = self.not_ready_reason(plan)
            if reason is not None:
                status.state, status.reason = ModelState.UNAVAILABLE, reason
                self._held_down.add(key)
            elif held:
                status.state, status.reason = ModelState.READY, ""
                self._held_down.discard(key)

    def not_ready_reason(self, plan: Plan) -> str | None:
        """The first step whose child is not READY, as one sentence, or None."""
        waiting = self._waiting_for(plan)
        if waiting is None:
            return None
        label, call, status = waiting
        if status is None:
            return f"{label}: {describe_key(model_key(call.model, call.version))} is not loaded"
        return f"{label}: {status.describe()}"

    def refusal(self, plan: Plan, status: ModelStatus) -> InferpoolError:
        """What a request to the pipeline (``status``: not READY) answers: the refusal of
        its first child that is not READY, naming the step (404 for a child unloaded or
        not listed, 503 otherwise); the pipeline's own when it is not waiting for one."""
        waiting = self._waiting_for(plan) if status.state is ModelState.UNAVAILABLE else None
        if waiting is None:
            return status.refusal()
        label, call, child = waiting
        if child is None:
            shown = describe_key(model_key(call.model, call.version))
            return ModelNotFound(f"{label}: {shown} is not loaded")
        nested = self.plans.get(child.key)  # a pipeline calling one that waits in turn
        error = child.refusal() if nested is None else self.refusal(nested, child)
        return type(error)(f"{label}: {error.message}")

    def _waiting_for(self, plan: Plan) -> tuple[str, Call, ModelStatus | None] | None:
        """The first step whose child is not READY: its label, the call and the child's
        status (None: not listed at all); None when every child is READY."""
        table = self.client.table
        for step in plan.steps:
            for call in step.every_call():
                try:
                    status = table.find(call.model, call.version)
                except ModelNotFound:
                    return step.label(plan.name), call, None
                if status.state is not ModelState.READY:
                    return step.label(plan.name), call, status
        return None

    # -- requests ----------------------------------------------------------------------------
    async def infer(
        self, plan: Plan, kind: int, body: bytes, json_length: int | None, deadline: float | None
    ) -> Reply:
        """Run one raw request through ``plan``; every failure comes back as a Reply."""
        # The tensors' path is imported on first use: a frontend without pipelines never
        # loads it (tests/unit/test_layering.py).
        from inferpool.engine.worker.wire_formats import wire_format
        from inferpool.protocol.rest_json import new_request_id

        wire = wire_format(kind)
        try:
            request = wire.decode(body, json_length)
        except InferpoolError as exc:
            return Reply.from_error(exc)
        run = Run(plan, request, self._call)
        try:
            outputs = await run.run(deadline)
            response = InferenceResponse(
                plan.name, outputs, plan.version, request.id or new_request_id()
            )
            encoded, length = wire.encode(response, request)
        except Exception as exc:  # InferpoolError: its status; else a 500, logged
            failed = Reply.from_error(exc, plan.name)
            return PipelineReply(failed.status, failed.body, steps=tuple(run.traces))
        first = request.inputs[0] if request.inputs else None
        rows = first.shape[0] if first is not None and first.shape else 1
        return PipelineReply(200, encoded, length, None, rows, rows, steps=tuple(run.traces))

    async def _call(
        self, call: Call, inputs: list[Tensor], deadline: float | None
    ) -> tuple[list[Tensor], Reply]:
        """One child call through the engine, as any gRPC request with raw contents."""
        from inferpool.protocol.grpc_raw import from_wire, to_wire

        requested = [RequestedOutput(name) for name in call.outputs or ()]
        body = to_wire(InferenceRequest(inputs, None, requested, call.parameters))
        reply = await self.client.infer(call.model, call.version, Kind.GRPC, body, None, deadline)
        if reply.status != 200:
            return [], reply
        # Read-only views of the reply's bytes: a step's outputs are only read.
        return from_wire(reply.body, writable=False).outputs, reply


def load_order(settings: list[ModelSettings]) -> list[ModelSettings]:
    """Pipelines ordered so that a pipeline calling another loads after it; those in a
    cycle come last (their load fails naming the cycle)."""
    by_name = {one.name: one for one in settings if one.pipeline is not None}
    ordered: list[ModelSettings] = []
    placed: set[str] = set()
    pending = [one for one in settings if one.pipeline is not None]
    while pending:
        ready = [
            one
            for one in pending
            if all(c in placed or c not in by_name for c in _children(one) - {one.name})
        ]
        if not ready:  # a cycle: the rest in their order
            ordered.extend(pending)
            break
        for one in ready:
            ordered.append(one)
            placed.add(one.name)
        pending = [one for one in pending if one.name not in placed]
    return ordered


def _children(settings: ModelSettings) -> set[str]:
    assert settings.pipeline is not None
    return settings.pipeline.children()
