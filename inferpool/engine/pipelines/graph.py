"""A pipeline's settings checked against the models loaded now, and made into a ``Plan``.

Everything that can be known before a request is checked here, so that a pipeline that
loads can only fail on what a request brings: each child model is READY, references name
the pipeline's inputs or outputs of earlier steps, outputs the children's metadata does
not list are refused, and a pipeline never reaches itself through its children (a
cycle). Each failure is one sentence naming the step. The plan also carries the
pipeline's V2 metadata: its declared inputs and outputs, else the ones derived from the
children it feeds from and answers with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferpool.engine.states import ModelState, ModelTable, describe_key, model_key
from inferpool.errors import ModelNotFound
from inferpool.settings import ModelSettings
from inferpool.settings.pipeline import (
    PARAMETERS,
    PIPELINE,
    ModelCall,
    PipelineSpec,
    Reference,
    StepSpec,
    parse_reference,
)

PLATFORM = "inferpool_pipeline"


class PlanError(ValueError):
    """Why a pipeline cannot load: one sentence."""


@dataclass(slots=True)
class Call:
    """A child model call, resolved: its explicit mapping, or the names its metadata
    declares for the default mapping."""

    model: str
    version: str | None
    inputs: dict[str, Reference] | None
    declared: list[str]
    outputs: list[str] | None
    parameters: dict[str, Any]
    # The child's metadata: its input specs by name, and the outputs it answers with.
    input_specs: dict[str, dict[str, Any]]
    answers: list[dict[str, Any]]


@dataclass(slots=True)
class Step:
    """One step of the plan; ``index`` counts from 1, as messages name it."""

    index: int
    name: str
    call: Call | None = None
    on: Reference | None = None  # router
    rule: str = "value"
    branches: dict[str, Call] = field(default_factory=dict)
    default: Call | None = None
    calls: list[Call] = field(default_factory=list)  # aggregator
    combine: str = ""
    axis: int = -1

    def label(self, pipeline: str) -> str:
        return f"pipeline '{pipeline}', step {self.index} ('{self.name}')"

    def every_call(self) -> list[Call]:
        if self.call is not None:
            return [self.call]
        if self.on is not None:
            return [*self.branches.values(), *([self.default] if self.default else [])]
        return list(self.calls)


@dataclass(slots=True)
class Plan:
    name: str
    version: str | None
    steps: list[Step]
    outputs: dict[str, Reference] | None
    children: set[str]
    metadata: dict[str, Any]


SpecOf = Callable[[str], PipelineSpec | None]


def build_plan(settings: ModelSettings, table: ModelTable, spec_of: SpecOf) -> Plan:
    """The plan of ``settings.pipeline``; ``PlanError`` with the reason when it cannot
    serve. ``spec_of(name)``: the pipeline spec of a model name, if it is a pipeline
    (loaded or about to load), for the cycle check."""
    spec = settings.pipeline
    assert spec is not None
    name = settings.name
    check_cycle(name, spec, spec_of)
    declared_inputs = {str(s["name"]) for s in settings.inputs if "name" in s}
    known: dict[str, set[str] | None] = {PIPELINE: declared_inputs or None}
    produced: dict[str, list[dict[str, Any]]] = {}
    steps: list[Step] = []
    for index, step_spec in enumerate(spec.steps, 1):
        step = _step(index, step_spec, name, table, known)
        answers = _answers(step)
        known[step.name] = {str(a["name"]) for a in answers} if answers else None
        produced[step.name] = answers
        steps.append(step)
    outputs = _mapping(spec.outputs, known, f"pipeline '{name}', output")
    metadata = {
        "name": name,
        "versions": [settings.version] if settings.version else [],
        "platform": PLATFORM,
        "inputs": settings.inputs or _derived_inputs(steps),
        "outputs": settings.outputs or _derived_outputs(steps, outputs, produced),
        "parameters": {"steps": [step.name for step in steps]},
    }
    return Plan(name, settings.version, steps, outputs, spec.children(), metadata)


def check_cycle(name: str, spec: PipelineSpec, spec_of: SpecOf) -> None:
    """``PlanError`` naming the cycle when pipeline ``name`` reaches itself."""
    cycle = find_cycle(name, spec, spec_of)
    if cycle:
        raise PlanError(f"pipeline '{name}' forms a cycle: {' -> '.join(cycle)}")


def find_cycle(name: str, spec: PipelineSpec, spec_of: SpecOf) -> list[str]:
    """The path by which pipeline ``name`` reaches itself through its children, or []."""
    path = [name]
    seen: set[str] = set()

    def visit(children: set[str]) -> bool:
        for child in sorted(children):
            path.append(child)
            if child == name:
                return True
            if child not in seen:
                seen.add(child)
                child_spec = spec_of(child)
                if child_spec is not None and visit(child_spec.children()):
                    return True
            path.pop()
        return False

    return path if visit(spec.children()) else []


def _step(
    index: int,
    spec: StepSpec,
    pipeline: str,
    table: ModelTable,
    known: dict[str, set[str] | None],
) -> Step:
    assert spec.name is not None
    step = Step(index, spec.name)
    where = step.label(pipeline)
    if spec.model is not None:
        step.call = _call(spec.call(), table, known, where)
    elif spec.route is not None:
        route = spec.route
        step.on, step.rule = parse_reference(route.on), route.rule
        if step.on.source != PARAMETERS:
            _check_reference(step.on, known, where + ", route 'on'")
        step.branches = {
            key: _call(call, table, known, f"{where}, branch '{key}'")
            for key, call in route.branches.items()
        }
        if route.default is not None:
            step.default = _call(route.default, table, known, f"{where}, default branch")
    elif spec.aggregate is not None:
        aggregate = spec.aggregate
        step.calls = [
            _call(call, table, known, f"{where}, model {position}")
            for position, call in enumerate(aggregate.models, 1)
        ]
        step.combine, step.axis = aggregate.combine, aggregate.axis
    return step


def _call(
    spec: ModelCall, table: ModelTable, known: dict[str, set[str] | None], where: str
) -> Call:
    """A child call checked: its model READY, its references and outputs known."""
    try:
        status = table.find(spec.model, spec.version)
    except ModelNotFound:
        raise PlanError(
            f"{where}: {describe_key(model_key(spec.model, spec.version))} is not loaded"
        ) from None
    if status.state is not ModelState.READY:
        raise PlanError(f"{where}: {status.describe()}")
    metadata = status.metadata
    input_specs = {str(s["name"]): s for s in metadata.get("inputs", []) if "name" in s}
    listed = [s for s in metadata.get("outputs", []) if "name" in s]
    names = [str(s["name"]) for s in listed]
    if spec.outputs is not None and names:
        missing = [output for output in spec.outputs if output not in names]
        if missing:
            raise PlanError(
                f"{where}: model '{spec.model}' has no output {_names(missing)} "
                f"(its metadata lists {_names(names)})"
            )
    inputs = _mapping(spec.inputs, known, f"{where}, input")
    wanted = spec.outputs if spec.outputs is not None else names[:1]
    answers = [s for s in listed if s["name"] in wanted] if names else []
    if spec.outputs is not None and not names:
        answers = [{"name": n, "datatype": "BYTES", "shape": [-1]} for n in spec.outputs]
    return Call(
        spec.model,
        spec.version,
        inputs,
        list(input_specs),
        spec.outputs,
        dict(spec.parameters),
        input_specs,
        answers,
    )


def _mapping(
    mapping: dict[str, str] | None, known: dict[str, set[str] | None], where: str
) -> dict[str, Reference] | None:
    """A name → reference map parsed, each reference checked (``where 'name'`` in errors)."""
    if mapping is None:
        return None
    parsed = {}
    for name, text in mapping.items():
        reference = parse_reference(text)
        _check_reference(reference, known, f"{where} '{name}'")
        parsed[name] = reference
    return parsed


def _check_reference(reference: Reference, known: dict[str, set[str] | None], where: str) -> None:
    if reference.source not in known:
        raise PlanError(
            f"{where}: '{reference}' names no earlier step (steps before it: "
            f"{_names([s for s in known if s != PIPELINE]) or 'none'})"
        )
    names = known[reference.source]
    if names is not None and reference.name not in names:
        owner = (
            "the pipeline's inputs"
            if reference.source == PIPELINE
            else f"step '{reference.source}'"
        )
        raise PlanError(
            f"{where}: {owner} has no '{reference.name}' (it has {_names(sorted(names))})"
        )


def _answers(step: Step) -> list[dict[str, Any]]:
    """The output specs a step answers with, when its children's metadata tells."""
    calls = step.every_call()
    if step.calls:
        return calls[0].answers  # combined under the first child's names
    if step.call is not None:
        return step.call.answers
    shapes = {tuple(str(a["name"]) for a in call.answers) for call in calls}
    return calls[0].answers if len(shapes) == 1 else []  # branches that agree


def _derived_inputs(steps: list[Step]) -> list[dict[str, Any]]:
    """The pipeline's inputs as its children declare the ones fed from it."""
    derived: dict[str, dict[str, Any]] = {}
    for step in steps:
        for call in step.every_call():
            if call.inputs is None:
                if step.index == 1:
                    for spec in call.input_specs.values():
                        derived.setdefault(str(spec["name"]), spec)
                continue
            for child_input, reference in call.inputs.items():
                if reference.source == PIPELINE:
                    spec = call.input_specs.get(child_input, {"datatype": "BYTES", "shape": [-1]})
                    derived.setdefault(reference.name, {**spec, "name": reference.name})
    return list(derived.values())


def _derived_outputs(
    steps: list[Step],
    outputs: dict[str, Reference] | None,
    produced: dict[str, list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    if outputs is None:
        return produced[steps[-1].name]
    derived = []
    for name, reference in outputs.items():
        specs = {str(s["name"]): s for s in produced.get(reference.source, [])}
        spec = specs.get(reference.name, {"datatype": "BYTES", "shape": [-1]})
        derived.append({**spec, "name": name})
    return derived


def _names(names: list[str]) -> str:
    return ", ".join(f"'{name}'" for name in names)
