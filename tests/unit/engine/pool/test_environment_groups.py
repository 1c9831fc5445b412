"""Worker groups for environments (``engine/pool/roster.py``) on a real ``Supervisor``
(``open_slots``, ``keeper_for``, ``fill``), without processes: the environment's unpacking,
its interpreter's probe, the template's start and the workers' starts are stand-ins. A
model naming an environment gets the group running it (started once, shared by concurrent
loads), one naming none no group; an environment that cannot be prepared or whose
interpreter does not run fails the load saying why; a configured group that cannot start
is logged. Real environments: tests/environments (tox -e environments)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from inferpool.engine.environments import unpack
from inferpool.engine.environments.interpreters import ProbeFailed
from inferpool.engine.environments.unpack import Environment
from inferpool.engine.pool import roster as roster_module
from inferpool.engine.pool.supervisor import Supervisor
from inferpool.engine.pool.template_keeper import TemplateKeeper
from inferpool.errors import InferpoolError, ModelLoadError
from inferpool.settings import ModelSettings, ServerSettings
from tests.unit.engine.pool.test_supervisor_workers import Pool, Worker


def environment(key: str = "abcdef0123456789") -> Environment:
    root = Path("/envs") / key
    return Environment(key, root, root / "bin" / "python3", f"{key}.tar.gz")


@pytest.fixture
def chief(monkeypatch) -> tuple[Supervisor, list[Any]]:
    """A supervisor of one default slot whose templates and workers do not start."""
    started: list[Any] = []
    monkeypatch.setattr(TemplateKeeper, "start", lambda keeper, preloads: started.append(keeper))
    monkeypatch.setattr(
        roster_module, "probe", lambda python: {"python": "3.11.7", "packages": {"numpy": "2"}}
    )
    supervisor = Supervisor(
        ServerSettings(workers=1, environment_workers=2),
        Pool(),
        lambda: False,  # type: ignore[arg-type]
    )

    async def spawn(slot: int, installs: int | None) -> Worker:
        await asyncio.sleep(0)
        return Worker(slot)

    monkeypatch.setattr(supervisor, "_spawn", spawn)
    return supervisor, started


def model(tmp_path: Path, **parameters: Any) -> ModelSettings:
    return ModelSettings(name="m", folder=tmp_path, parameters=parameters)


def test_a_model_naming_an_environment_gets_its_group_started_once(chief, tmp_path, monkeypatch):
    supervisor, started = chief
    prepared: list[Path] = []

    def prepare(named: Path, cache: Path) -> Environment:
        prepared.append(named)
        return environment()

    monkeypatch.setattr(unpack, "prepare", prepare)
    settings = model(tmp_path, environment_tarball="env.tar.gz")

    async def run() -> list[Any]:
        roster = supervisor.roster
        assert await roster.group_for(model(tmp_path)) is None  # names none
        first, second = await asyncio.gather(roster.group_for(settings), roster.group_for(settings))
        third = await roster.group_for(settings)
        return [first, second, third]

    first, second, third = asyncio.run(run())
    assert first is second is third  # one group for the environment
    assert first.name == "env-abcdef01"
    assert list(first.slots) == [1, 2]  # after the default group's slot 0
    assert supervisor.group_of(2) is first
    assert len(supervisor.workers) == 3 and len(started) == 1  # one template for the group
    assert prepared == [tmp_path / "env.tar.gz"] * 3
    assert first.keeper is started[0] and first.keeper is not supervisor.templates
    assert supervisor.roster.environment_key(settings) == "abcdef0123456789"


def test_a_load_arriving_while_the_group_starts_waits_for_its_workers(chief, tmp_path, monkeypatch):
    """The group is known from its probe on, its workers only once started: a load that
    asks then gets it with them (2026-12-07: eleven alibi-detect models in one
    environment, three got it before its workers and failed: "2 run another environment")."""
    supervisor, _ = chief
    monkeypatch.setattr(unpack, "prepare", lambda named, cache: environment())
    settings = model(tmp_path, environment_tarball="env.tar.gz")
    spawning = asyncio.Event()

    async def spawn(slot: int, installs: int | None) -> Worker:
        await spawning.wait()
        return Worker(slot)

    monkeypatch.setattr(supervisor, "_spawn", spawn)

    async def run() -> tuple[Any, int]:
        roster = supervisor.roster
        first = asyncio.ensure_future(roster.group_for(settings))
        while "abcdef0123456789" not in roster.environments:  # probed, workers starting
            await asyncio.sleep(0.001)
        late = asyncio.ensure_future(roster.group_for(settings))
        await asyncio.sleep(0.05)
        assert not late.done()  # it waits for the workers
        spawning.set()
        group = await late
        workers = len(supervisor.workers)
        assert await first is group
        return group, workers

    group, workers = asyncio.run(asyncio.wait_for(run(), timeout=10))
    assert group.name == "env-abcdef01"
    assert workers == 3  # the default slot's worker and the group's two


def test_an_environment_that_cannot_be_used_fails_the_load(chief, tmp_path, monkeypatch):
    supervisor, started = chief

    def unusable(named: Path, cache: Path) -> Environment:
        raise InferpoolError(f"environment {named.name} is not a tarball")

    monkeypatch.setattr(unpack, "prepare", unusable)
    with pytest.raises(ModelLoadError, match=r"environment env\.tar\.gz is not a tarball"):
        asyncio.run(supervisor.roster.group_for(model(tmp_path, environment_tarball="env.tar.gz")))

    def no_python(python: Path) -> dict[str, Any]:
        raise ProbeFailed(f"{python} does not run")

    monkeypatch.setattr(unpack, "prepare", lambda named, cache: environment())
    monkeypatch.setattr(roster_module, "probe", no_python)
    with pytest.raises(ModelLoadError) as caught:
        asyncio.run(supervisor.roster.group_for(model(tmp_path, environment_path="env")))
    assert caught.value.message == (
        "environment abcdef0123456789.tar.gz: /envs/abcdef0123456789/bin/python3 does not run"
    )
    assert started == [] and len(supervisor.roster.groups) == 1


def test_configured_groups_start_in_turn_and_one_that_cannot_is_logged(
    tmp_path, monkeypatch, caplog
):
    started: list[Any] = []
    monkeypatch.setattr(TemplateKeeper, "start", lambda keeper, preloads: started.append(keeper))
    monkeypatch.setattr(roster_module, "probe", lambda python: {"python": "3.11.7"})

    def prepare(named: Path, cache: Path) -> Environment:
        if named.name == "broken":
            raise InferpoolError("cannot unpack broken")
        return environment(named.name.ljust(16, "0"))

    monkeypatch.setattr(unpack, "prepare", prepare)
    groups = [
        {"name": "good", "workers": 1, "environment": str(tmp_path / "good")},
        {"name": "bad", "workers": 1, "environment": str(tmp_path / "broken")},
    ]
    supervisor = Supervisor(
        ServerSettings(workers=1, worker_groups=groups),
        Pool(),
        lambda: False,  # type: ignore[arg-type]
    )

    async def spawn(slot: int, installs: int | None) -> Worker:
        return Worker(slot)

    monkeypatch.setattr(supervisor, "_spawn", spawn)
    with caplog.at_level(logging.ERROR):
        asyncio.run(supervisor.roster.start_configured())
    assert [group.name for group in supervisor.roster.groups] == ["default", "good"]
    assert len(started) == 1
    assert "worker group 'bad' cannot start: cannot unpack broken" in caplog.text
