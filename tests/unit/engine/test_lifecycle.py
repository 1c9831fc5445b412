"""The lifecycle alone, over a fake host (where models run) and a real model table: the
states each version goes through on load, reload and unload, and the readiness they make."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from inferpool.engine.accounting import Accounting
from inferpool.engine.admin import AdminPolicy
from inferpool.engine.lifecycle import Lifecycle, NamedLocks, StartupFailed, exchanges_headers
from inferpool.engine.pipelines.manager import Pipelines
from inferpool.engine.repository import Discovered
from inferpool.engine.states import UNLOADED, ModelKey, ModelState, ModelTable, model_key
from inferpool.errors import InferpoolError, ModelLoadError
from inferpool.settings import ModelSettings, ServerSettings


class FakeHost:
    """Where models run, as the lifecycle sees it: loads that succeed or fail as the test
    says, and a record of what was loaded, unloaded and started, in order."""

    def __init__(self, table: ModelTable) -> None:
        self.table = table  # the pipelines read it
        self.calls: list[str] = []
        self.fail: dict[str, str] = {}
        self.seen: dict[str, list[ModelState]] = {}  # the table's state during each load
        self.unload_error: Exception | None = None
        self.lifecycle: Lifecycle | None = None  # the one under test (the pipelines ask it)

    async def _start_workers(self) -> None:
        self.calls.append("start")

    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        listed = self.table.get(model_key(settings.name, settings.version))
        self.seen.setdefault(settings.name, []).append(listed.state if listed else None)
        self.calls.append(f"load {settings.name}")
        await asyncio.sleep(0)
        if settings.name in self.fail:
            raise InferpoolError(self.fail[settings.name])
        return {"name": settings.name}

    async def _unload(self, key: ModelKey) -> None:
        self.calls.append(f"unload {key}")
        if self.unload_error is not None:
            raise self.unload_error


def lifecycle(**settings: Any) -> tuple[Lifecycle, FakeHost]:
    server = ServerSettings(**settings)
    table = ModelTable()
    host = FakeHost(table)
    pipelines = Pipelines(host)  # type: ignore[arg-type]
    accounting = Accounting(server, table)
    admin = AdminPolicy.from_settings(server)
    host.lifecycle = Lifecycle(server, table, accounting, pipelines, admin, host)  # type: ignore[arg-type]
    return host.lifecycle, host


def found(name: str, version: str | None = None) -> Discovered:
    parameters = {"version": version} if version is not None else {}
    settings = ModelSettings(name=name, implementation="m.R", parameters=parameters)
    return Discovered(name, settings)


def test_a_new_version_is_listed_loading_then_ready_with_statistics() -> None:
    life, host = lifecycle()
    status = asyncio.run(life.load_discovered(found("a")))
    assert host.seen["a"] == [ModelState.LOADING]  # listed while it loads
    assert status.state is ModelState.READY and status.required and status.exchanges_headers
    assert life.table.get("a") is status and status.metadata == {"name": "a"}
    assert "a" in life.accounting.stats and life.accounting.load_seconds["a"] >= 0
    assert len(life.locks) == 0


def test_a_new_version_that_fails_is_listed_failed_and_counts_only_if_required() -> None:
    life, host = lifecycle()
    host.fail["a"] = "it is bad"
    status = asyncio.run(life.load_discovered(found("a")))
    assert (status.state, status.reason, status.required) == (
        ModelState.FAILED,
        "it is bad",
        False,
    )
    assert "a" not in life.accounting.stats and "a" in life.accounting.load_seconds
    life.started = True
    assert (
        life.not_ready_reason()
        == "no model is loaded (pass --allow-empty to serve an empty repository)"
    )
    required = asyncio.run(life.load_discovered(found("b"), required=False))
    assert required.state is ModelState.READY
    assert life.not_ready_reason() is None  # the FAILED one does not count
    host.fail["c"] = "broken"
    asyncio.run(life.load_discovered(found("c"), required=True))
    assert life.not_ready_reason() == "model 'c' failed to load: broken"


def test_unreadable_settings_fail_without_reaching_the_host() -> None:
    life, host = lifecycle()
    status = asyncio.run(life.load_discovered(Discovered("x", None, "bad json")))
    assert (status.state, status.reason) == (ModelState.FAILED, "bad json")
    assert host.calls == [] and life.table.get("x") is status


def test_a_reload_keeps_the_serving_version_listed_until_it_succeeds() -> None:
    life, host = lifecycle()
    first = asyncio.run(life.load_discovered(found("a")))
    stats = life.accounting.stats["a"]
    host.fail["a"] = "no memory"
    failed = asyncio.run(life.load_discovered(found("a")))
    assert host.seen["a"] == [ModelState.LOADING, ModelState.READY]  # served meanwhile
    assert failed.state is ModelState.FAILED
    assert life.table.get("a") is first and first.state is ModelState.READY
    assert first.reason == "reload failed: no memory"
    assert life.accounting.stats["a"] is stats
    del host.fail["a"]
    second = asyncio.run(life.load_discovered(found("a")))
    assert life.table.get("a") is second and second.state is ModelState.READY
    assert second.reason == "" and life.accounting.stats["a"] is stats  # goes on counting


def test_an_unloaded_version_stays_listed_or_is_dropped() -> None:
    life, host = lifecycle()
    asyncio.run(life.load_discovered(found("a", "1")))
    asyncio.run(life.load_discovered(found("a", "2")))
    one, two = life.table.versions("a")
    asyncio.run(life.unload_version(one, keep=True))
    assert (one.state, one.reason, one.required) == (ModelState.UNAVAILABLE, UNLOADED, False)
    assert one.unloaded and life.table.get(one.key) is one
    assert one.key not in life.accounting.stats and one.key not in life.accounting.load_seconds
    asyncio.run(life.unload_version(two, keep=False))
    assert life.table.get(two.key) is None and two.key not in life.accounting.stats
    assert host.calls[-2:] == ["unload a\x001", "unload a\x002"]


def test_a_failing_unload_still_forgets_the_version() -> None:
    life, host = lifecycle()
    status = asyncio.run(life.load_discovered(found("a")))
    host.unload_error = RuntimeError("the worker is gone")
    with pytest.raises(RuntimeError, match="gone"):
        asyncio.run(life.unload_version(status, keep=False))
    assert life.table.get("a") is None and "a" not in life.accounting.stats


def test_unload_named_by_key_unloads_that_version_only() -> None:
    life, _ = lifecycle()
    asyncio.run(life.load_discovered(found("a", "1")))
    asyncio.run(life.load_discovered(found("a", "2")))
    asyncio.run(life.unload_named("a", "a\x001", held={"a\x001"}))
    states = {s.version: s.state for s in life.table.versions("a")}
    assert states == {"1": ModelState.UNAVAILABLE, "2": ModelState.READY}


def test_readiness_follows_start_up_drain_and_shutdown(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model-settings.json").write_text('{"implementation": "m.R"}')
    life, host = lifecycle(model_repository=tmp_path)
    assert life.not_ready_reason() == "server is starting up"
    statuses = asyncio.run(life.start())
    assert host.calls == ["start", "load a"] and [s.state for s in statuses] == [ModelState.READY]
    assert life.started and life.not_ready_reason() is None
    life.begin_drain()
    assert life.draining and not life.stopping
    assert life.not_ready_reason() == "server is shutting down"
    assert life.begin_shutdown() is True
    assert life.begin_shutdown() is False  # once
    assert life.stopping


def test_start_up_failures_stop_it_with_exit_on_error(tmp_path: Path) -> None:
    for name in ("a", "bad"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model-settings.json").write_text('{"implementation": "m.R"}')
    life, host = lifecycle(model_repository=tmp_path, exit_on_error=True)
    host.fail["bad"] = "it is bad"
    with pytest.raises(StartupFailed) as error:
        asyncio.run(life.start())
    assert error.value.reasons == ["model 'bad' failed to load: it is bad"]
    assert not life.started


def test_load_model_reports_a_failed_version_as_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model-settings.json").write_text('{"implementation": "m.R"}')
    life, host = lifecycle(model_repository=tmp_path)
    host.fail["a"] = "boom"
    with pytest.raises(ModelLoadError, match="boom"):
        asyncio.run(life.load_model("a"))
    assert life.table.find("a").state is ModelState.FAILED


def test_named_locks_serialise_one_name_and_forget_it_after() -> None:
    locks = NamedLocks()
    order: list[str] = []

    async def hold(name: str, tag: str) -> None:
        async with locks.hold(name):
            order.append(f"{tag} in")
            await asyncio.sleep(0.01)
            order.append(f"{tag} out")

    async def scenario() -> None:
        await asyncio.gather(hold("m", "1"), hold("m", "2"), hold("other", "3"))

    asyncio.run(scenario())
    assert order.index("1 out") < order.index("2 in")  # one model: one at a time
    assert order.index("3 in") < order.index("1 out")  # another model: alongside
    assert len(locks) == 0


@pytest.mark.parametrize(
    ("named", "exchanges"),
    [
        ({"implementation": "my_models.Custom"}, True),  # a user's class
        ({"implementation": "mlserver_alibi_detect.AlibiDetectRuntime"}, True),
        ({"runtime": "alibi-explain"}, True),  # x-seldon-alibi-* as HTTP headers
        ({"implementation": "mlserver_sklearn.SKLearnModel"}, False),
        ({"runtime": "lightgbm"}, False),
    ],
)
def test_headers_go_to_a_users_runtime_and_alibis_only(named: dict, exchanges: bool) -> None:
    """The built-in runtimes other than alibi's never pay for the headers block."""
    assert exchanges_headers(ModelSettings(name="m", **named)) is exchanges
