"""The ``pipeline`` key of a model's ``model-settings.json``: what a pipeline declares.

A pipeline is a model whose settings list steps instead of naming an artefact; the
engine runs it (``engine/pipelines``). This module owns only the format and the checks
that need nothing but the document itself (a step's kind, its references' syntax, names
used twice); what needs the other models (do they exist, do their outputs) is checked at
load by ``engine/pipelines/graph.py``. docs/pipelines.md describes the format.

A reference names a tensor: ``pipeline.<input>`` (or ``pipeline.inputs.<input>``) for
one of the pipeline's own inputs, ``<step>.<output>`` (or ``<step>.outputs.<output>``)
for an output of an earlier step, and ``parameters.<key>`` (a router's ``on`` only) for
a parameter of the request.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

PIPELINE = "pipeline"  # the source name of the pipeline's own inputs
PARAMETERS = "parameters"  # the source name of the request's parameters (routers)


class Reference(NamedTuple):
    """A parsed reference: its source (a step's name, ``pipeline`` or ``parameters``)
    and the tensor's (or parameter's) name there."""

    source: str
    name: str

    def __str__(self) -> str:
        return f"{self.source}.{self.name}"


def parse_reference(text: str) -> Reference:
    """``"scale.outputs.y"`` → ``Reference("scale", "y")``; ValueError when malformed."""
    source, dot, rest = text.partition(".")
    for middle in ("outputs.", "inputs."):
        if source != PARAMETERS and rest.startswith(middle):
            rest = rest[len(middle) :]  # Seldon's spelling; empty: nothing named
            break
    if not dot or not source or not rest:
        raise ValueError(
            f"reference {text!r} must be '<step>.<output>', 'pipeline.<input>' or "
            "'parameters.<key>'"
        )
    return Reference(source, rest)


class ModelCall(BaseModel):
    """One call of a child model: which model, how its inputs are fed, what it returns."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(min_length=1)
    version: str | None = None
    # Child input name → reference. None: by name, else the previous step's outputs.
    inputs: dict[str, str] | None = None
    # The child's outputs to ask for (None: its default outputs).
    outputs: list[str] | None = None
    # Request parameters sent to the child (the pipeline request's are not forwarded:
    # a request-level content type of the pipeline is rarely the child's).
    parameters: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _references(self) -> ModelCall:
        for reference in (self.inputs or {}).values():
            if parse_reference(reference).source == PARAMETERS:
                raise ValueError(f"input reference {reference!r}: a tensor must be named")
        return self


class RouteSpec(BaseModel):
    """A router: one branch runs, chosen per request by a value."""

    model_config = ConfigDict(extra="forbid")

    # A tensor reference, or ``parameters.<key>`` for a request parameter.
    on: str
    # ``value``: the tensor's (single) value; ``argmax``: the index of its largest
    # element along the last axis (a classifier's probabilities choose the branch).
    rule: Literal["value", "argmax"] = "value"
    branches: dict[str, ModelCall] = Field(min_length=1)
    default: ModelCall | None = None

    @model_validator(mode="after")
    def _check_on(self) -> RouteSpec:
        parse_reference(self.on)
        return self


class AggregateSpec(BaseModel):
    """An aggregator: every child runs (concurrently), their outputs are combined."""

    model_config = ConfigDict(extra="forbid")

    models: list[ModelCall] = Field(min_length=2)
    combine: Literal["concat", "mean", "vote"]
    axis: int = -1  # the axis ``concat`` joins along (features, by default)


class StepSpec(ModelCall):
    """A step: a model call (``model``...), a router (``route``) or an aggregator
    (``aggregate``); ``name`` defaults to the model's name."""

    model: str | None = None  # type: ignore[assignment]
    name: str | None = Field(None, min_length=1)
    route: RouteSpec | None = None
    aggregate: AggregateSpec | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> StepSpec:
        kinds = [k for k in ("model", "route", "aggregate") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("a step has exactly one of 'model', 'route' or 'aggregate'")
        if self.model is None and (self.inputs or self.outputs or self.parameters):
            raise ValueError("'inputs', 'outputs' and 'parameters' belong to a model step")
        if self.name is None:
            if self.model is None:
                raise ValueError("a route or aggregate step needs a 'name'")
            self.name = self.model
        if "." in self.name or self.name in (PIPELINE, PARAMETERS):
            raise ValueError(f"step name {self.name!r} cannot hold '.' or be {PIPELINE!r}")
        return self

    def call(self) -> ModelCall:
        """A model step as the call it makes."""
        assert self.model is not None
        return ModelCall(
            model=self.model,
            version=self.version,
            inputs=self.inputs,
            outputs=self.outputs,
            parameters=self.parameters,
        )


class PipelineSpec(BaseModel):
    """The ``pipeline`` key: its steps in order, and which tensors it answers with."""

    model_config = ConfigDict(extra="forbid")

    steps: list[StepSpec] = Field(min_length=1)
    # Pipeline output name → reference. None: the last step's outputs.
    outputs: dict[str, str] | None = None

    @model_validator(mode="after")
    def _distinct_names(self) -> PipelineSpec:
        names = [step.name for step in self.steps]
        repeated = sorted({name for name in names if name is not None and names.count(name) > 1})
        if repeated:
            raise ValueError(f"step names must differ: {', '.join(repeated)} repeated")
        for reference in (self.outputs or {}).values():
            if parse_reference(reference).source == PARAMETERS:
                raise ValueError(f"output reference {reference!r}: a tensor must be named")
        return self

    def children(self) -> set[str]:
        """Every model name its steps may call (for cycles and readiness)."""
        names: set[str] = set()
        for step in self.steps:
            if step.model is not None:
                names.add(step.model)
            elif step.route is not None:
                calls = [*step.route.branches.values(), step.route.default]
                names.update(call.model for call in calls if call is not None)
            elif step.aggregate is not None:
                names.update(call.model for call in step.aggregate.models)
        return names
