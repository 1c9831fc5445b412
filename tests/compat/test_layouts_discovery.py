"""Repository layouts without a server: what ``discover`` finds in MLServer's and Triton's
layouts, which version answers a request naming none, and the client's bookkeeping of
versions (load and unload by name, the poll watcher, ``ModelStatus.exchanges_headers``)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from inferpool.engine.client import EngineClient
from inferpool.engine.repository import discover, find_models
from inferpool.engine.states import ModelState, ModelStatus, ModelTable, model_key
from inferpool.errors import InferpoolError, ModelNotFound, NotReady
from inferpool.settings import ModelSettings, ServerSettings


def model_folder(root: Path, folder: str, **settings: Any) -> Path:
    path = root / folder
    path.mkdir(parents=True, exist_ok=True)
    (path / "model-settings.json").write_text(json.dumps(settings))
    return path


def artefact(root: Path, folder: str, filename: str = "model.joblib") -> Path:
    path = root / folder
    path.mkdir(parents=True, exist_ok=True)
    (path / filename).write_bytes(b"")
    return path


def found(root: Path) -> list[tuple[str, str | None, bool]]:
    """(name, version, read) of every model version ``discover`` finds."""
    return [(d.name, d.version, d.settings is not None) for d in discover(root)]


# -- discovery -------------------------------------------------------------------------
def test_settings_files_are_found_at_any_depth(tmp_path: Path) -> None:
    model_folder(tmp_path, "team-a/fraud/detector", implementation="m.Runtime")
    model_folder(tmp_path, "team-a/churn", name="churn-model", implementation="m.Runtime")
    artefact(tmp_path, "plain")  # a direct folder without settings: today's model
    (tmp_path / "empty").mkdir()  # no settings, no artefact beside settings: no model
    model_folder(tmp_path, ".hidden/x", implementation="m.Runtime")
    model_folder(tmp_path, "team-a/_private", implementation="m.Runtime")
    assert found(tmp_path) == [
        ("plain", None, True),
        ("churn-model", None, True),
        ("detector", None, True),
    ]


def test_a_broken_folder_is_listed_with_its_reason_beside_the_others(tmp_path: Path) -> None:
    model_folder(tmp_path, "good", implementation="m.Runtime")
    model_folder(tmp_path, "deep/er/good-too", implementation="m.Runtime")
    (tmp_path / "deep" / "er" / "bad").mkdir()
    (tmp_path / "deep" / "er" / "bad" / "model-settings.json").write_text("{")
    model_folder(tmp_path, "bad-name", name="a/b")
    entries = {d.name: d for d in discover(tmp_path)}
    assert entries["good"].settings is not None
    assert entries["good-too"].settings is not None
    # Listed under its path in the repository: its own name is unknown.
    assert "not valid JSON" in entries["deep/er/bad"].error
    assert "name" in entries["bad-name"].error


def test_mlserver_versions_side_by_side_and_duplicates(tmp_path: Path) -> None:
    for folder, version in (("iris-v1", "v1"), ("iris-v2", "v2"), ("z-again", "v1")):
        model_folder(tmp_path, folder, name="iris", parameters={"version": version})
    model_folder(tmp_path, "nested/iris", name="iris")  # unversioned: another key
    entries = discover(tmp_path)
    assert [(d.name, d.version) for d in entries] == [
        ("iris", "v1"),
        ("iris", "v2"),
        ("iris", None),
        ("z-again", None),
    ]
    duplicate = entries[-1]
    assert duplicate.settings is None
    assert "'iris' version 'v1' is already served from" in duplicate.error
    assert str(tmp_path / "iris-v1") in duplicate.error
    assert [d.version for d in find_models(tmp_path, "iris")] == ["v1", "v2", None]


def test_triton_numbered_versions_inherit_the_model_folders_settings(tmp_path: Path) -> None:
    model_folder(tmp_path, "iris", parameters={"uri": "./clf.joblib"}, max_batch_size=8)
    for version in ("1", "10", "2"):
        artefact(tmp_path, f"iris/{version}", "clf.joblib")
    artefact(tmp_path, "iris/01")  # not a version (Triton: no leading 0), nor a model
    artefact(tmp_path, "bare/3")  # no settings file at all
    entries = discover(tmp_path)
    assert [(d.name, d.version) for d in entries] == [
        ("bare", "3"),
        ("iris", "1"),
        ("iris", "2"),
        ("iris", "10"),
    ]
    ten = entries[-1].settings
    assert ten is not None and ten.max_batch_size == 8
    assert ten.resolve(ten.parameters.uri or "") == tmp_path / "iris" / "10" / "clf.joblib"


def test_a_symlink_loop_ends_and_nothing_outside_is_walked(tmp_path: Path) -> None:
    root, outside = tmp_path / "models", tmp_path / "outside"
    model_folder(root, "group/m", implementation="m.Runtime")
    (root / "group" / "m" / "loop").symlink_to(root / "group", target_is_directory=True)
    model_folder(outside, "secret/x", implementation="m.Runtime")
    (root / "group" / "away").symlink_to(outside / "secret", target_is_directory=True)
    assert found(root) == [("m", None, True)]


# -- the default version -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("versions", "latest", "then"),
    [
        (["1", "2", "10"], "10", "2"),  # numbers as numbers (Triton)
        (["v1", "v2", "v10"], "v2", "v10"),  # other strings as strings (MLServer)
        (["3", None, "7"], None, "7"),  # a model without a version comes first (MLServer)
    ],
)
def test_unversioned_requests_go_to_the_latest_ready_version(
    versions: list[str | None], latest: str | None, then: str
) -> None:
    table = ModelTable()
    for version in versions:
        table.set(ModelStatus("m", version, ModelState.READY))
    assert table.ready_model("m").version == latest
    failed = table.get(model_key("m", latest))
    assert failed is not None
    failed.state = ModelState.FAILED
    assert table.ready_model("m").version == then
    assert table.ready_model("m", then).version == then
    if latest is not None:
        with pytest.raises(NotReady, match=f"version '{latest}' failed to load"):
            table.ready_model("m", latest)
    with pytest.raises(ModelNotFound, match="no version 'v9'"):
        table.find("m", "v9")
    for version in versions:
        table.remove(model_key("m", version))
    with pytest.raises(ModelNotFound):
        table.find("m")


def test_with_no_ready_version_the_latest_says_why() -> None:
    table = ModelTable()
    table.set(ModelStatus("m", "1", ModelState.FAILED, "broken"))
    table.set(ModelStatus("m", "2", ModelState.LOADING))
    with pytest.raises(NotReady, match="model 'm' version '2' is LOADING"):
        table.ready_model("m")


# -- the client's bookkeeping ------------------------------------------------------------
class FakeClient(EngineClient):
    """A client whose loads succeed or fail as the test says."""

    def __init__(self, root: Path, **settings: Any) -> None:
        super().__init__(ServerSettings(model_repository=root, **settings))
        self.fail: set[str | None] = set()  # versions whose load fails
        self.loaded: set[str] = set()

    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        await asyncio.sleep(0)
        if settings.version in self.fail:
            raise InferpoolError(f"version {settings.version} is broken")
        self.loaded.add(f"{settings.name}:{settings.version}")
        return {"name": settings.name}

    async def _unload(self, key: str) -> None:
        self.loaded.discard(key.replace("\x00", ":"))

    async def _infer(self, *args: Any) -> Any:
        raise NotImplementedError


def test_load_and_unload_by_name_take_every_version(tmp_path: Path) -> None:
    for version in ("1", "2"):
        model_folder(tmp_path, f"m-{version}", name="m", implementation="x.Custom",
                     parameters={"version": version})  # fmt: skip
    model_folder(tmp_path, "builtin", runtime="sklearn")

    async def scenario() -> None:
        client = FakeClient(tmp_path)
        await client.start()
        assert client.loaded == {"m:1", "m:2", "builtin:None"}
        assert client.table.find("m", "1").exchanges_headers
        assert client.table.find("m").exchanges_headers
        assert not client.table.find("builtin").exchanges_headers
        await client.unload_model("m")
        assert client.loaded == {"builtin:None"}
        # Still in the repository: listed as unloaded (as Triton's index).
        assert [(s.name, s.version, s.reason) for s in client.table.all() if s.unloaded] == [
            ("m", "1", "unloaded"),
            ("m", "2", "unloaded"),
        ]
        # Version 3 appears, version 1 goes: load takes what the repository holds.
        (tmp_path / "m-1" / "model-settings.json").unlink()
        (tmp_path / "m-1").rmdir()
        model_folder(tmp_path, "m-3", name="m", implementation="x.Custom",
                     parameters={"version": "3"})  # fmt: skip
        statuses = await client.load_model("m")
        assert [s.version for s in statuses] == ["2", "3"]
        assert sorted(s.version for s in client.table.versions("m")) == ["2", "3"]
        assert client.table.find("m").version == "3"
        # A new version that fails leaves the one it would replace serving.
        model_folder(tmp_path, "m-3", name="m", implementation="x.Custom",
                     parameters={"version": "4"})  # fmt: skip
        client.fail.add("4")
        with pytest.raises(InferpoolError, match="version 4 is broken"):
            await client.load_model("m")
        kept = client.table.find("m", "3")
        assert kept.state is ModelState.READY and "reload failed" in kept.reason
        assert client.table.find("m").version == "3"
        assert client.table.find("m", "4").state is ModelState.FAILED
        assert client.not_ready_reason() is None

    asyncio.run(scenario())


async def until(condition: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_the_poll_watcher_follows_versions_and_broken_folders(tmp_path: Path) -> None:
    model_folder(tmp_path, "iris-v1", name="iris", implementation="m.R",
                 parameters={"version": "v1"})  # fmt: skip

    def versions(client: EngineClient) -> dict[str | None, ModelState]:
        return {s.version: s.state for s in client.table.all() if s.name == "iris"}

    async def scenario() -> None:
        client = FakeClient(tmp_path, model_control_mode="poll", repository_debounce=0.1)
        await client.start()
        try:
            model_folder(tmp_path, "group/iris-v2", name="iris", implementation="m.R",
                         parameters={"version": "v2"})  # fmt: skip
            (tmp_path / "broken").mkdir()
            (tmp_path / "broken" / "model-settings.json").write_text("[")
            await until(lambda: versions(client).get("v2") is ModelState.READY)
            assert client.table.find("iris").version == "v2"
            await until(lambda: client.table.get("broken") is not None)
            assert client.table.find("broken").state is ModelState.FAILED
            assert versions(client) == {"v1": ModelState.READY, "v2": ModelState.READY}
            # The group folder goes: its version is unloaded, the other stays.
            (tmp_path / "group" / "iris-v2" / "model-settings.json").unlink()
            (tmp_path / "group" / "iris-v2").rmdir()
            (tmp_path / "group").rmdir()
            await until(lambda: "v2" not in versions(client))
            assert client.table.find("iris").version == "v1"
        finally:
            await client.close()

    asyncio.run(scenario())
