"""Poll mode without a server: which paths count, what a folder asks for, and the watcher
following a repository for a client whose loads are faked."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from inferpool.engine.client import EngineClient
from inferpool.engine.repository import discover
from inferpool.engine.states import ModelState
from inferpool.engine.watcher import RepositoryWatcher, action, ignored, touched_folders
from inferpool.errors import ModelNotFound
from inferpool.settings import ModelSettings, ServerSettings


@pytest.mark.parametrize(
    "path",
    [
        ".staging/model.joblib",
        "_drafts/model.joblib",
        ".DS_Store",
        "iris/.hidden",
        "iris/sub/.git/HEAD",
        "iris/__pycache__/m.cpython-311.pyc",
        "iris/m.pyc",
        "iris/.model.joblib.swp",
        "iris/model.joblib.swx",
        "iris/model.joblib~",
        "iris/#model-settings.json#",
        "iris/4913",
        "iris/model.joblib.tmp",
        "iris/model.joblib.part",
    ],
)
def test_paths_that_are_no_model_change(path: str) -> None:
    assert ignored(Path(path).parts)


@pytest.mark.parametrize(
    "path", ["iris", "iris/model.joblib", "iris/model-settings.json", "iris/sub/weights.bin"]
)
def test_paths_that_change_a_model(path: str) -> None:
    assert not ignored(Path(path).parts)


def test_touched_folders_are_the_top_level_names(tmp_path: Path) -> None:
    paths = [
        tmp_path / "a" / "model.joblib",
        tmp_path / "a" / "sub" / "x",
        tmp_path / "b",
        tmp_path / ".tmp" / "c" / "model.joblib",
        tmp_path / "a" / ".model.joblib.swp",
        tmp_path.parent / "elsewhere",
        tmp_path,
    ]
    assert touched_folders(tmp_path, [str(p) for p in paths]) == {"a", "b"}


def test_what_a_touched_folder_asks_for() -> None:
    assert action(exists=True, loaded_as=None) == "load"
    assert action(exists=True, loaded_as="m") == "reload"
    assert action(exists=False, loaded_as="m") == "unload"
    assert action(exists=False, loaded_as=None) is None


# -- the watcher, for a fake client -------------------------------------------------------
class FakeClient(EngineClient):
    def __init__(self, root: Path, **settings: Any) -> None:
        super().__init__(
            ServerSettings(
                model_repository=root,
                model_control_mode="poll",
                repository_debounce=0.1,
                **settings,
            )
        )
        self.loads: list[str] = []
        self.fail: dict[str, BaseException] = {}

    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        self.loads.append(settings.name)
        if settings.name in self.fail:
            raise self.fail[settings.name]
        return {"name": settings.name}

    async def _unload(self, name: str) -> None:
        pass

    async def _infer(self, *args: Any) -> Any:
        raise NotImplementedError


def model_folder(root: Path, folder: str, **settings: Any) -> Path:
    path = root / folder
    path.mkdir(parents=True, exist_ok=True)
    (path / "model-settings.json").write_text(json.dumps(settings))
    return path


async def until(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def states(client: EngineClient) -> dict[str, ModelState]:
    return {status.name: status.state for status in client.table.all()}


def test_the_watcher_follows_the_repository(tmp_path: Path) -> None:
    model_folder(tmp_path, "a", implementation="m.Runtime")

    async def scenario() -> None:
        client = FakeClient(tmp_path)
        await client.start()
        # A new folder; one whose load raises something unexpected does not stop the watch.
        client.fail["boom"] = RuntimeError("unexpected")
        model_folder(tmp_path, "boom", implementation="m.Runtime")
        model_folder(tmp_path, "b", implementation="m.Runtime")
        await until(lambda: states(client).get("b") is ModelState.READY)
        # Its settings now name another model: that one is loaded, the old name unloaded.
        model_folder(tmp_path, "b", name="c", implementation="m.Runtime")
        await until(lambda: "c" in states(client) and "b" not in states(client))
        # Removed: unloaded.
        (tmp_path / "a" / "model-settings.json").unlink()
        (tmp_path / "a").rmdir()
        await until(lambda: "a" not in states(client))
        assert states(client)["c"] is ModelState.READY
        watcher = client.lifecycle.watcher
        assert watcher is not None and watcher._tasks
        await client.close()
        assert client.lifecycle.watcher is None and not watcher._tasks

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_folders_that_came_or_went_unseen_are_acted_on(tmp_path: Path) -> None:
    """Between start-up's read of the repository and the watch, nothing is missed."""
    model_folder(tmp_path, "kept", implementation="m.Runtime")
    model_folder(tmp_path, "gone", implementation="m.Runtime")

    async def scenario() -> None:
        client = FakeClient(tmp_path)
        await client.load_repository()
        await client.stop_watching()
        found = discover(tmp_path)  # what start-up read: kept and gone
        # Changes made before the watch is set up:
        model_folder(tmp_path, "late", implementation="m.Runtime")
        (tmp_path / "gone" / "model-settings.json").unlink()
        (tmp_path / "gone").rmdir()
        client.lifecycle.watcher = RepositoryWatcher(client, tmp_path, 0.1)
        client.lifecycle.watcher.start(found)
        await until(lambda: set(states(client)) == {"kept", "late"})
        await client.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_the_repository_api_works_beside_the_watcher(tmp_path: Path) -> None:
    """Poll mode takes loads and unloads by name at once; an unload holds until the
    folder changes, a model the API loaded is followed by the watcher from then on."""
    model_folder(tmp_path, "a", implementation="m.Runtime")

    async def scenario() -> None:
        client = FakeClient(tmp_path)
        await client.start()
        await client.unload_model("a")
        status = client.table.find("a")
        assert (status.state, status.reason) == (ModelState.UNAVAILABLE, "unloaded")
        await asyncio.sleep(1.5)  # past the quiet period and an idle comparison
        assert client.table.find("a").unloaded and client.loads == ["a"]
        # The folder changes: the watcher loads it again.
        model_folder(tmp_path, "a", implementation="m.Runtime", parameters={"extra": {}})
        await until(lambda: states(client)["a"] is ModelState.READY)
        # Loaded by the API before the watcher acted on it: followed from then on.
        model_folder(tmp_path, "b", implementation="m.Runtime")
        await client.load_model("b")
        watcher = client.lifecycle.watcher
        assert watcher is not None and "b" in watcher.models
        for path in (tmp_path / "b").iterdir():
            path.unlink()
        (tmp_path / "b").rmdir()
        await until(lambda: "b" not in states(client))
        with pytest.raises(ModelNotFound):
            await client.unload_model("b")
        await client.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
