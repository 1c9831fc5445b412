"""The pool's worker groups: which slots each holds, and which of them may hold a model.

The server's own template forks ``shared_slots`` workers and preloads ``shared_preloads``.
``GroupRoster`` builds the groups the server's own template forks (the ``default`` group,
then the configured ``worker_groups`` without an environment, in their order of slots),
starts the configured groups with an environment of their own, and a group for an
environment a model names when no group runs it yet (``group_for``: a tarball is unpacked
once, its interpreter probed for what it offers). It answers the capability filter
(``groups.eligible``) for placement and the stall handling. Starting a group's workers is
the supervisor's (``SlotHost``): the roster only asks it for slots, a template and the
group's first workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from inferpool.engine.environments.capabilities import Capabilities
from inferpool.engine.environments.interpreters import ProbeFailed, probe
from inferpool.engine.pool.groups import (
    WorkerGroup,
    eligible,
    names_environment,
    refusal,
    runtime_library,
)
from inferpool.engine.pool.outages import Outages
from inferpool.engine.repository import discover
from inferpool.errors import InferpoolError, ModelLoadError
from inferpool.settings import ModelSettings, ServerSettings

if TYPE_CHECKING:
    from inferpool.engine.environments.unpack import Environment
    from inferpool.engine.pool.handles import WorkerHandle
    from inferpool.engine.pool.template_keeper import TemplateKeeper

logger = logging.getLogger(__name__)


def shared_preloads(settings: ServerSettings) -> list[dict[str, Any]]:
    """The settings (as JSON) of the repository's models the server's own template preloads
    at start: a model with an environment of its own is never loaded by it."""
    repository = settings.model_repository
    found = []
    with contextlib.suppress(FileNotFoundError):  # load_repository reports it
        found = discover(repository) if repository is not None else []
    documents = [d.settings.model_dump(mode="json") for d in found if d.settings]
    server = settings.environment_tarball
    return [d for d in documents if not names_environment(d, server)]


def shared_slots(settings: ServerSettings) -> int:
    """How many slots the server's own template forks: the default group's and those of
    the configured groups without an environment."""
    plain = (group.workers for group in settings.worker_groups if group.environment is None)
    return settings.workers + sum(plain)


class SlotHost(Protocol):
    """What the roster asks of the supervisor to start a group with an environment."""

    def open_slots(self, count: int) -> range:
        """``count`` new slots after the existing ones, empty for now."""

    def keeper_for(self, outages: Outages, python: Path) -> TemplateKeeper:
        """A template keeper (not started) running ``python``."""

    async def fill(self, group: WorkerGroup) -> None:
        """Start the group's first workers; one that fails is replaced later."""


class GroupRoster:
    """The worker groups, by slot and by environment."""

    def __init__(
        self,
        settings: ServerSettings,
        templates: TemplateKeeper,
        outages: Outages,
        host: SlotHost,
    ) -> None:
        self.settings = settings
        self.host = host
        self.groups = [
            WorkerGroup("default", range(settings.workers), templates, outages,
                        tuple(settings.worker_tags)),
        ]  # fmt: skip
        for group in settings.worker_groups:
            if group.environment is not None:
                continue
            base = self.groups[-1].slots.stop
            slots = range(base, base + group.workers)
            self.groups.append(
                WorkerGroup(group.name, slots, templates, outages, tuple(group.tags))
            )
        # Groups running an environment, by its key; and the key of each environment a
        # model named (by the path it named), as last prepared.
        self.environments: dict[str, WorkerGroup] = {}
        self.named: dict[str, str] = {}
        self._adding: dict[str, asyncio.Future[WorkerGroup]] = {}

    def group_of(self, slot: int) -> WorkerGroup:
        for group in self.groups:
            if slot in group.slots:
                return group
        raise KeyError(slot)

    def environment_key(self, settings: ModelSettings) -> str | None:
        """The key of the environment the model names, once ``group_for`` prepared it."""
        from inferpool.engine.environments.unpack import named_environment

        named = named_environment(settings, self.settings.environment_tarball)
        return None if named is None else self.named.get(str(named))

    def eligible(
        self, settings: ModelSettings, workers: list[WorkerHandle]
    ) -> tuple[list[WorkerHandle], dict[str, int]]:
        """``groups.eligible``: the workers that may hold the model, the others by why not."""
        return eligible(settings, self.environment_key(settings), workers, self.group_of)

    def eligible_slots(self, settings: ModelSettings) -> set[int]:
        """Every slot, live or not, whose group may hold the model."""
        environment, requirements = self.environment_key(settings), settings.requirements
        library = runtime_library(settings)
        return {
            slot
            for group in self.groups
            if refusal(group, environment, requirements, library) is None
            for slot in group.slots
        }

    async def group_for(self, settings: ModelSettings) -> WorkerGroup | None:
        """The group running the environment the model names (started now if none does);
        None if it names none. ModelLoadError if the environment cannot be used."""
        from inferpool.engine.environments.unpack import default_cache, named_environment, prepare

        named = named_environment(settings, self.settings.environment_tarball)
        if named is None:
            return None
        cache = self.settings.environments_dir or default_cache()
        try:
            environment = await asyncio.to_thread(prepare, named, cache)
        except InferpoolError as exc:
            raise ModelLoadError(exc.message) from None
        self.named[str(named)] = environment.key
        # While the group is being added, it is already in ``environments`` (from its probe
        # on) but its first workers are not up: a load placed then found none of them.
        adding = self._adding.get(environment.key)
        if adding is None:
            group = self.environments.get(environment.key)
            if group is not None:
                return group
            name = f"env-{environment.key[:8]}"
            workers = self.settings.environment_workers
            adding = asyncio.ensure_future(self.add_group(name, environment, workers, []))
            self._adding[environment.key] = adding
            adding.add_done_callback(lambda _: self._adding.pop(environment.key, None))
        return await asyncio.shield(adding)

    async def add_group(
        self, name: str, environment: Environment, workers: int, tags: list[str]
    ) -> WorkerGroup:
        """Start ``workers`` workers with ``environment``'s interpreter, under a template
        of their own; ModelLoadError if the interpreter cannot run them."""
        try:
            found = await asyncio.to_thread(probe, environment.python)
        except ProbeFailed as exc:
            raise ModelLoadError(f"environment {environment.source}: {exc}") from None
        probed = Capabilities.from_dict(found)
        slots = self.host.open_slots(workers)
        outages = Outages(slots.stop)
        keeper = self.host.keeper_for(outages, environment.python)
        group = WorkerGroup(name, slots, keeper, outages, tuple(tags), environment, probed)
        self.groups.append(group)
        self.environments[environment.key] = group
        logger.info("starting %s", group.describe())
        keeper.start([])
        await self.host.fill(group)
        return group

    async def start_configured(self) -> None:
        """The configured groups with an environment, one after the other."""
        for group in self.settings.worker_groups:
            if group.environment is not None:
                await self._start_configured(group.name, group.environment, group.workers,
                                             group.tags)  # fmt: skip

    async def _start_configured(self, name: str, named: str, workers: int, tags: list[str]) -> None:
        """A configured group with an environment; one that cannot start is logged (the
        models that need it fail to load, saying why)."""
        from inferpool.engine.environments.unpack import default_cache, prepare

        cache = self.settings.environments_dir or default_cache()
        try:
            environment = await asyncio.to_thread(prepare, Path(named), cache)
            self.named[str(Path(named))] = environment.key
            if environment.key not in self.environments:
                await self.add_group(name, environment, workers, tags)
        except InferpoolError as exc:
            logger.error("worker group '%s' cannot start: %s", name, exc.message)
