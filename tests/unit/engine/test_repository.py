"""The model repository API's rules without a server: names confined to the repository,
the admin token, which models count for readiness, reloads that fail, and custom runtime
modules imported from their model's folder."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from inferpool.engine.admin import AdminPolicy, SettingsError, authorization_of
from inferpool.engine.client import EngineClient
from inferpool.engine.repository import discover, find_models, name_problem
from inferpool.engine.states import ModelState
from inferpool.errors import BadRequest, Forbidden, InferpoolError, ModelNotFound, Unauthorized
from inferpool.runtimes.registry import runtime_class
from inferpool.settings import ModelSettings, ServerSettings, read_model_settings


def model_folder(root: Path, folder: str, **settings: Any) -> Path:
    path = root / folder
    path.mkdir(parents=True)
    (path / "model-settings.json").write_text(json.dumps(settings))
    return path


# -- names ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["", "..", ".", "../x", "a/b", "a\\b", "x\x00y", "a..b", "x\ny", "n" * 256]
)
def test_names_that_could_leave_the_repository_are_refused(tmp_path: Path, name: str) -> None:
    assert name_problem(name) is not None
    with pytest.raises(BadRequest, match="invalid model name"):
        find_models(tmp_path, name)


@pytest.mark.parametrize("name", ["iris", "iris-rf", "model_1.v2", "Modèle"])
def test_ordinary_names_are_allowed(name: str) -> None:
    assert name_problem(name) is None


def test_a_symlink_out_of_the_repository_is_refused_unread(tmp_path: Path) -> None:
    root, outside = tmp_path / "models", tmp_path / "outside"
    root.mkdir()
    model_folder(outside, "secret", name="escape", implementation="nowhere.Runtime")
    (root / "escape").symlink_to(outside / "secret", target_is_directory=True)
    with pytest.raises(BadRequest, match="outside the model repository"):
        find_models(root, "escape")
    # Found by its settings name only through a folder inside the repository: never here.
    (root / "other").symlink_to(outside / "secret", target_is_directory=True)
    assert find_models(root, "missing") == []


def test_a_symlink_inside_the_repository_is_followed(tmp_path: Path) -> None:
    model_folder(tmp_path, "real", implementation="m.Runtime")
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    (found,) = find_models(tmp_path, "alias")
    assert found is not None and found.settings is not None and found.name == "alias"


def test_a_model_is_found_by_its_settings_name_or_its_folder(tmp_path: Path) -> None:
    model_folder(tmp_path, "folder-a", name="named-b", implementation="m.Runtime")
    (found,) = find_models(tmp_path, "named-b")
    assert found is not None and found.settings is not None
    assert found.settings.folder == tmp_path / "folder-a"
    assert find_models(tmp_path, "folder-a") == []  # its settings call it named-b


def test_a_settings_name_with_a_path_fails_under_its_folder_name(tmp_path: Path) -> None:
    model_folder(tmp_path, "odd", name="../../etc/x", implementation="m.Runtime")
    (found,) = discover(tmp_path)
    assert found.name == "odd" and found.settings is None
    assert "name" in found.error and "'..'" in found.error


# -- the admin token -------------------------------------------------------------------
def test_no_token_no_check() -> None:
    AdminPolicy().require(None)
    AdminPolicy().require("Bearer anything")


def test_the_token_is_required_and_compared() -> None:
    policy = AdminPolicy("explicit", "s3cret-token")
    with pytest.raises(Unauthorized, match="needs the admin token"):
        policy.require(None)
    for wrong in ("Bearer s3cret-toke", "Bearer s3cret-token2", "s3cret-token", "Basic x"):
        with pytest.raises(Unauthorized):
            policy.require(wrong)
    policy.require("Bearer s3cret-token")
    policy.require("bearer  s3cret-token ")
    assert "s3cret" not in repr(policy)


def test_control_mode_none_refuses_after_the_token() -> None:
    with pytest.raises(Forbidden, match="model-control-mode none"):
        AdminPolicy("none").require(None)
    with pytest.raises(Unauthorized):
        AdminPolicy("none", "t").require(None)
    with pytest.raises(Forbidden):
        AdminPolicy("none", "t").require("Bearer t")


def test_token_settings(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text("  from-a-file\n")
    policy = AdminPolicy.from_settings(ServerSettings(admin_token_file=file))
    policy.require("Bearer from-a-file")
    file.write_text("other")  # read once, at start-up
    policy.require("Bearer from-a-file")
    assert AdminPolicy.from_settings(ServerSettings(admin_token=" t ")).token_required
    assert not AdminPolicy.from_settings(ServerSettings()).token_required
    problems = {
        "not both": ServerSettings(admin_token="t", admin_token_file=file),
        "is empty": ServerSettings(admin_token_file=tmp_path / "empty"),
        "cannot read": ServerSettings(admin_token_file=tmp_path / "missing"),
        "--admin-token is empty": ServerSettings(admin_token="  "),
        "printable": ServerSettings(admin_token="a\x01b"),
    }
    (tmp_path / "empty").write_text("\n \n")
    for message, settings in problems.items():
        with pytest.raises(SettingsError, match=message) as error:
            AdminPolicy.from_settings(settings)
        assert "from-a-file" not in str(error.value)


def test_authorization_metadata() -> None:
    assert authorization_of(None) is None
    assert authorization_of([("x-other", "1"), ("Authorization", "Bearer t")]) == "Bearer t"
    assert authorization_of([("authorization", b"Bearer t")]) == "Bearer t"


# -- the client's bookkeeping: readiness, reloads, unloads ------------------------------
class FakeClient(EngineClient):
    """A client whose loads succeed or fail as the test says."""

    def __init__(self, root: Path, **settings: Any) -> None:
        super().__init__(ServerSettings(model_repository=root, **settings))
        self.fail: dict[str, str] = {}
        self.loaded: dict[str, ModelSettings] = {}

    async def _load(self, settings: ModelSettings) -> dict[str, Any]:
        await asyncio.sleep(0)
        if settings.name in self.fail:
            raise InferpoolError(self.fail[settings.name])
        self.loaded[settings.name] = settings
        return {"name": settings.name, "versions": [settings.version or ""]}

    async def _unload(self, name: str) -> None:
        self.loaded.pop(name, None)

    async def _infer(self, *args: Any) -> Any:
        raise NotImplementedError


def test_a_new_model_that_fails_through_the_api_keeps_the_server_ready(tmp_path: Path) -> None:
    model_folder(tmp_path, "good", implementation="m.Runtime")

    async def scenario() -> None:
        client = FakeClient(tmp_path)
        await client.start()
        assert client.not_ready_reason() is None
        model_folder(tmp_path, "new", implementation="m.Runtime")
        client.fail["new"] = "ZeroDivisionError: boom"
        with pytest.raises(InferpoolError, match="boom") as error:
            await client.load_model("new")
        assert error.value.status == 500
        assert client.table.find("new").state is ModelState.FAILED
        assert client.not_ready_reason() is None
        # Bad settings are the caller's 400, and do not turn the server not ready either.
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "model-settings.json").write_text("{")
        with pytest.raises(BadRequest, match="not valid JSON"):
            await client.load_model("bad")
        assert client.not_ready_reason() is None
        # Once loaded, it counts: the same failure later would turn the server not ready.
        del client.fail["new"]
        await client.load_model("new")
        assert client.table.find("new").required
        with pytest.raises(ModelNotFound):
            await client.load_model("absent")

    asyncio.run(scenario())


def test_a_start_up_failure_stays_strict_until_unloaded(tmp_path: Path) -> None:
    model_folder(tmp_path, "good", implementation="m.Runtime")
    model_folder(tmp_path, "broken", implementation="m.Runtime")

    async def scenario() -> None:
        client = FakeClient(tmp_path, exit_on_error=False)
        client.fail["broken"] = "boom"
        await client.start()
        assert "broken" in (client.not_ready_reason() or "")
        with pytest.raises(InferpoolError):
            await client.load_model("broken")
        assert "broken" in (client.not_ready_reason() or "")
        await client.unload_model("broken")
        assert client.not_ready_reason() is None
        # Still in the repository: listed as unloaded (as Triton), and unloads again.
        assert client.table.find("broken").unloaded
        await client.unload_model("broken")
        # Gone from the repository: dropped, then unknown.
        shutil.rmtree(tmp_path / "broken")
        with pytest.raises(ModelNotFound):
            await client.unload_model("broken")
        assert client.table.get("broken") is None
        with pytest.raises(ModelNotFound):
            await client.unload_model("../../etc")

    asyncio.run(scenario())


def test_a_failed_reload_keeps_the_serving_version(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "m", implementation="m.Runtime", parameters={"version": "1"})

    async def scenario() -> None:
        client = FakeClient(tmp_path)
        await client.start()
        (folder / "model-settings.json").write_text(
            json.dumps({"implementation": "m.Runtime", "parameters": {"version": "2"}})
        )
        client.fail["m"] = "the new file is broken"
        with pytest.raises(InferpoolError, match="new file is broken"):
            await client.load_model("m")
        status = client.table.find("m")
        assert status.state is ModelState.READY and status.version == "1"
        assert status.reason == "reload failed: the new file is broken"
        assert client.not_ready_reason() is None
        # Broken settings: the same, with a 400.
        (folder / "model-settings.json").write_text("[]")
        with pytest.raises(BadRequest):
            await client.load_model("m")
        assert client.table.find("m").state is ModelState.READY
        # A reload that works replaces it and clears the reason.
        (folder / "model-settings.json").write_text(
            json.dumps({"implementation": "m.Runtime", "parameters": {"version": "2"}})
        )
        del client.fail["m"]
        await client.load_model("m")
        status = client.table.find("m")
        assert (status.state, status.version, status.reason) == (ModelState.READY, "2", "")
        assert len(client.lifecycle.locks) == 0

    asyncio.run(scenario())


def test_a_model_stays_listed_ready_while_it_reloads(tmp_path: Path) -> None:
    model_folder(tmp_path, "m", implementation="m.Runtime")

    async def scenario() -> None:
        client = FakeClient(tmp_path)
        await client.load_repository()
        reload = asyncio.ensure_future(client.load_model("m"))
        await asyncio.sleep(0)
        assert client.table.find("m").state is ModelState.READY
        await reload

    asyncio.run(scenario())


def test_loads_and_unloads_of_one_model_take_turns(tmp_path: Path) -> None:
    model_folder(tmp_path, "m", implementation="m.Runtime")

    async def scenario() -> None:
        client = FakeClient(tmp_path, allow_empty=True)
        gate = asyncio.Event()
        order: list[str] = []
        load = client._load

        async def slow_load(settings: ModelSettings) -> dict[str, Any]:
            order.append("load")
            await gate.wait()
            return await load(settings)

        client._load = slow_load  # type: ignore[method-assign]
        loading = asyncio.ensure_future(client.load_model("m"))
        await asyncio.sleep(0.01)
        unloading = asyncio.ensure_future(client.unload_model("m"))
        await asyncio.sleep(0.01)
        assert not unloading.done()  # it waits for the load of the same model
        gate.set()
        await loading
        await unloading
        assert "m" not in client.loaded and client.table.find("m").unloaded
        assert len(client.lifecycle.locks) == 0
        # Names that are refused or unknown never get a lock.
        for name in ("../x", "no-such-model"):
            with pytest.raises((BadRequest, ModelNotFound)):
                await client.load_model(name)
            with pytest.raises(ModelNotFound):
                await client.unload_model(name)
        assert len(client.lifecycle.locks) == 0

    asyncio.run(scenario())


def test_control_mode_none_refuses_loads_and_unloads(tmp_path: Path) -> None:
    model_folder(tmp_path, "m", implementation="m.Runtime")

    async def scenario() -> None:
        client = FakeClient(tmp_path, model_control_mode="none")
        await client.load_repository()
        for call in (client.load_model, client.unload_model):
            with pytest.raises(Forbidden):
                await call("m")
        assert client.table.find("m").state is ModelState.READY

    asyncio.run(scenario())


# -- custom runtimes: imported from their folder, after the standard library ------------
RUNTIME = """
from inferpool import Runtime

import helper_{tag}

VALUE = "{tag}"


class Same(Runtime):
    def load(self):
        self.helper = helper_{tag}.NAME
"""

SHADOW = "raise ImportError('the model folder shadowed a standard-library module')\n"


def test_each_folder_gets_its_own_module_and_never_shadows_the_stdlib(tmp_path: Path) -> None:
    folders = []
    for tag in ("one", "two"):
        folder = model_folder(tmp_path, tag, implementation="model.Same")
        (folder / "model.py").write_text(RUNTIME.format(tag=tag))
        (folder / f"helper_{tag}.py").write_text(f"NAME = 'helper {tag}'\n")
        for shadowed in ("json.py", "random.py", "colorsys.py"):
            (folder / shadowed).write_text(SHADOW)
        folders.append(folder)
    before = list(sys.path)
    try:
        classes = [runtime_class(read_model_settings(f, f.name)) for f in folders]
        assert [sys.modules[c.__module__].VALUE for c in classes] == ["one", "two"]
        assert classes[0] is not classes[1]
        assert sys.path[: len(before)] == before  # the folders were appended, not inserted
        import colorsys  # noqa: F401 - not yet imported anywhere: would hit a shadow

        # A reload executes the folder's current file.
        (folders[0] / "model.py").write_text(RUNTIME.format(tag="one").replace('"one"', '"1b"'))
        again = runtime_class(read_model_settings(folders[0], "one"))
        assert sys.modules[again.__module__].VALUE == "1b"
    finally:
        sys.path[:] = before
