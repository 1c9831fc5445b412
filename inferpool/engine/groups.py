"""Worker groups: which worker slots run which interpreter, offering what.

The server's own workers are the ``default`` group; ``worker_groups`` in the settings
add more, each with tags and optionally an environment of its own; a model naming an
environment that no group runs gets a group of ``environment_workers`` for it when it
loads. Groups without an environment are forked by the server's template process and
hold slots ``0 .. shared_slots - 1``; a group with an environment has a template of its
own, started with that environment's interpreter (``interpreters.py``), and the slots
after. Every worker is still connected the same way (memfd rings and doorbells, passed
to its template over the control socket).

``eligible`` is the scheduler's first filter, by capability: a model goes only to the
groups running the environment it names (none: the server's interpreter), and only to
those meeting its requirements; the others are counted by the reason, which ends up
in the placement's one summary sentence.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferpool.engine.capabilities import Capabilities, here, unmet
from inferpool.engine.outages import Outages
from inferpool.settings import ModelSettings

if TYPE_CHECKING:
    from inferpool.engine.environments import Environment
    from inferpool.engine.handles import WorkerHandle
    from inferpool.engine.template_keeper import TemplateKeeper

ENVIRONMENT_KEYS = ("environment_tarball", "environment_path")


@dataclass(eq=False)
class WorkerGroup:
    """Slots that run one interpreter and offer the same capabilities."""

    name: str
    slots: range
    keeper: TemplateKeeper
    outages: Outages
    tags: tuple[str, ...] = ()
    environment: Environment | None = None
    # An environment's, read by its probe; the server's own are read when first needed.
    probed: Capabilities | None = None

    @property
    def capabilities(self) -> Capabilities:
        offered = self.probed if self.probed is not None else here()
        return offered.with_tags(self.tags)

    def describe(self) -> str:
        where = f"environment {self.environment.source}" if self.environment else "the server's"
        return (
            f"worker group '{self.name}' (workers {list(self.slots)}, {where}: "
            f"{self.capabilities.describe()})"
        )


def names_environment(document: dict[str, Any]) -> bool:
    """The model settings (as JSON) name an environment of their own."""
    parameters = document.get("parameters") or {}
    return any(parameters.get(key) for key in ENVIRONMENT_KEYS)


def refusal(group: WorkerGroup, environment: str | None, requirements: list[str]) -> str | None:
    """Why ``group`` may not hold a model running ``environment`` (a key; None: the
    server's own) with ``requirements``; None if it may."""
    runs = group.environment.key if group.environment is not None else None
    if runs != environment:
        return "run another environment" if environment else "run an environment"
    missing = unmet(requirements, group.capabilities) if requirements else None
    return None if missing is None else f"lack '{missing}'"


def eligible(
    settings: ModelSettings,
    environment: str | None,
    workers: list[WorkerHandle],
    group_of: Callable[[int], WorkerGroup],
) -> tuple[list[WorkerHandle], dict[str, int]]:
    """The workers whose group may hold the model; the others counted by why not."""
    requirements = settings.requirements
    refused: dict[str, int] = collections.Counter()
    chosen = []
    for worker in workers:
        reason = refusal(group_of(worker.slot), environment, requirements)
        if reason is None:
            chosen.append(worker)
        else:
            refused[reason] += 1
    return chosen, dict(refused)
