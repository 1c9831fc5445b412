"""Worker groups: which worker slots run which interpreter, offering what.

The server's own workers are the ``default`` group; ``worker_groups`` in the settings
add more, each with tags and optionally an environment of its own; a model naming an
environment that no group runs gets a group of ``environment_workers`` for it when it
loads. Groups without an environment are forked by the server's template process and
hold slots ``0 .. shared_slots - 1``; a group with an environment has a template of its
own, started with that environment's interpreter (``environments/interpreters.py``), and the slots
after. Every worker is still connected the same way (memfd rings and doorbells, passed
to its template over the control socket).

``eligible`` is the scheduler's first filter, by capability: a model goes only to the
groups running the environment it names (none: the server's interpreter), only to those
that can import its built-in runtime's library, and only to those meeting its
requirements; the others are counted by the reason, which ends up in the placement's one
summary sentence.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from inferpool.engine.environments.capabilities import (
    RUNTIME_LIBRARIES,
    Capabilities,
    here,
    importable_here,
    unmet,
)
from inferpool.engine.pool.outages import Outages
from inferpool.errors import RuntimeNotFound
from inferpool.settings import ModelSettings

if TYPE_CHECKING:
    from inferpool.engine.environments.unpack import Environment
    from inferpool.engine.pool.handles import WorkerHandle
    from inferpool.engine.pool.template_keeper import TemplateKeeper

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

    def offers(self, module: str) -> bool:
        """The group's interpreter can import ``module`` (a runtime's library)."""
        if self.probed is None:
            return importable_here(module)
        return self.probed.version_of(module) is not None

    def describe(self) -> str:
        where = f"environment {self.environment.source}" if self.environment else "the server's"
        return (
            f"worker group '{self.name}' (workers {list(self.slots)}, {where}: "
            f"{self.capabilities.describe()})"
        )


def names_environment(document: dict[str, Any], server: Path | None = None) -> bool:
    """The model settings (as JSON) name an environment of their own, or run in the
    ``server``'s (``ServerSettings.environment_tarball``), which every model runs in."""
    parameters = document.get("parameters") or {}
    return server is not None or any(parameters.get(key) for key in ENVIRONMENT_KEYS)


class RuntimeLibrary(NamedTuple):
    """The library a built-in runtime's models import, and the extra that installs it."""

    module: str
    extra: str
    #: what to do instead of installing the extra ("" to install it)
    install: str = ""

    def refused(self) -> str:
        """The reason a worker without it gives: "lack 'lightgbm' (install ...)"."""
        return f"lack '{self.module}' ({self.install or f'install inferpool[{self.extra}]'})"


def runtime_library(settings: ModelSettings) -> RuntimeLibrary | None:
    """The model's built-in runtime's library; None for a custom runtime, or a model whose
    runtime is not recognised here (its load says why, in the worker)."""
    from inferpool.runtimes.registry import RUNTIMES, runtime_name_for

    try:
        runtime = runtime_name_for(settings)
    except (RuntimeNotFound, OSError, ValueError):
        return None
    entry, module = RUNTIMES.get(runtime), RUNTIME_LIBRARIES.get(runtime)
    return (
        None
        if entry is None or module is None
        else RuntimeLibrary(module, entry.extra, entry.install)
    )


def refusal(
    group: WorkerGroup,
    environment: str | None,
    requirements: list[str],
    library: RuntimeLibrary | None = None,
) -> str | None:
    """Why ``group`` may not hold a model running ``environment`` (a key; None: the
    server's own) with ``requirements`` and its runtime's ``library``; None if it may."""
    runs = group.environment.key if group.environment is not None else None
    if runs != environment:
        return "run another environment" if environment else "run an environment"
    return lacking(group.offers, lambda: group.capabilities, requirements, library)


def lacking(
    offers: Callable[[str], bool],
    capabilities: Callable[[], Capabilities],
    requirements: list[str],
    library: RuntimeLibrary | None,
) -> str | None:
    """What an interpreter lacks of a model's runtime ``library`` (``offers`` says whether
    it can import a module) and of its ``requirements`` (``capabilities``, read only when
    there are some), as a refusal: "lack 'lightgbm>=4.0'"; None if it lacks nothing."""
    if library is not None and not offers(library.module):
        return library.refused()
    missing = unmet(requirements, capabilities()) if requirements else None
    return None if missing is None else f"lack '{missing}'"


def eligible(
    settings: ModelSettings,
    environment: str | None,
    workers: list[WorkerHandle],
    group_of: Callable[[int], WorkerGroup],
) -> tuple[list[WorkerHandle], dict[str, int]]:
    """The workers whose group may hold the model; the others counted by why not."""
    requirements, library = settings.requirements, runtime_library(settings)
    refused: dict[str, int] = collections.Counter()
    chosen = []
    for worker in workers:
        reason = refusal(group_of(worker.slot), environment, requirements, library)
        if reason is None:
            chosen.append(worker)
        else:
            refused[reason] += 1
    return chosen, dict(refused)
